"""Pickle handling, the lowest layer above the model: nothing from a checkpoint is ever executed.

The verdict:
- `policy.py`: THE rule that judges a global (`resolve(module, name)`), asked by every reader below: Python 2 and
  dotted names as the unpickler would resolve them, what calling the result may run;
- `allowlist.py`: which names may be referenced (allowed / dangerous / unknown); `callables.py`: which may be
  called (inert constructors, plain data classes, what `THROUGH` helpers do with their arguments);
- `walk.py` (entry points, `PickleWalk`), `engine.py` (the opcode loop), `judge.py` (what each global reference and
  call means, implicit calls through unpickler hooks included), `walkstate.py` (stack values, byte source) and
  `opcodes.py` (the opcode table): the opcode walker, which builds no object and gives the verdict;
- `candidates.py` + `zipdir.py`: every pickle any zip reader could take from an archive (members, byte strings,
  tensor storages).

Reading:
- `unpickle.py`: the only unpickler (allowlisting; globals become inert stand-ins) and its bounds; `report.py`: the
  one `PickleReport` (what was referenced and called) and the one builder of its findings (CK601 / CK602 / CK604);
- `standins.py`, `builders.py` (stand-in values for allowlisted torch / numpy / builtin constructors), `plain.py`
  (stand-ins to plain values);
- `torch_archive.py`: `torch.save` zip archives (directory, `data.pkl`, storages); `legacy_format.py`: torch's
  non-zip serialization (`_use_new_zipfile_serialization=False`); `tar_archive.py`: pre-1.6 tar saves, never
  extracted.

The streaming evaluator of DCP `.metadata` files is DCP's own and lives with its reader (`formats/dcp/vm_*.py`).
"""
