"""`diff` of two checkpoints: orchestration, checkpoint facts and tensors (`diff.py`), args classification (`args.py`),
chunk values read from their byte ranges (`values.py`), optimizer state across DistributedOptimizer formats
(`optim.py`), values of N-D reformulated tensors (`reformulated.py`), tolerances, ignored keys and the fingerprint shortcut
(`tolerance.py`); a Megatron checkpoint against its Hugging Face export (`convert.py`, its values `convert_values.py`,
the per-architecture tables `mappings/`).
"""
