"""PyTorch DCP: the only package that knows the `.metadata` format and the files of a DCP checkpoint dir.

- `reader.py`: the DCP dir reader (`read_dcp`: torch_dcp / fsdp_dtensor; `read_dcp_dir`, which torch_dist builds on);
- `ranks.py`: per-rank `__R.metadata` files (`dcp.save(..., use_collectives=False)`), merged;
- `hf.py`: what torch's Hugging Face storage writer saves (safetensors, no `.metadata`);
- `stream.py`: `read_metadata`, THE entry point for a `.metadata` (path, bytes or file): the streaming reader (the
  file read once, chunks as columns), falling back to the reference; `SeenMetadata`, what a sniff parsed handed to
  the reader that follows it;
- `metadata.py`: `DcpMetadata` (what either reader returns) and the reference reader (the allowlisting unpickler,
  then stand-ins to the model);
- `names.py`: the torch class names a `.metadata` pickles, and the records the reference asks the unpickler for;
- `table.py`: the streaming walk's columns joined into a `ChunkTable`;
- `vm_eval.py` (values, memo, the column sink), `vm_walk.py` (the opcode loop): the streaming evaluator;
- `vm_fast.py`, `vm_patterns.py`, `vm_batch.py`, `vm_ctx.py`: its batch paths over the records a writer repeats
  per chunk; `vm_bounds.py`: the list / object boundaries a run crosses, replayed with the loop's own steps;
  `vm_stats.py`: `ReadStats`, how many records of each kind the batch paths read and how many fell to the loop.
"""
