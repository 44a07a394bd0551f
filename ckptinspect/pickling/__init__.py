"""Pickle handling, the lowest layer above the model: nothing from a checkpoint is ever executed.

- `unpickle.py`: the only unpickler (allowlisting; globals become inert stand-ins), its bounds and report;
- `allowlist.py`: the global classification (allowed / dangerous / unknown);
- `builders.py`: stand-in values for allowlisted torch/numpy constructors; `plain.py`: stand-ins to plain values;
- `walk.py` + `opcodes.py`: the opcode walker (no unpickling at all) and its opcode table;
- `torch_archive.py`: `torch.save` zip archives (directory, `data.pkl`, storages).
"""
