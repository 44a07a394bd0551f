"""The streaming writer of `make_synthetic_ckpt.py`: the same checkpoint, with ``.metadata`` streamed.

Three passes over the deterministic per-rank layout (`make_synthetic_ckpt.iter_ranks`), one per section of the
pickle, in the order ``pickle.dump(Metadata)`` writes them:

1. collect every key (first-seen order) and every chunk (key, offsets, sizes) in compact arrays, then write
   ``state_dict_metadata`` (each tensor's chunk objects, memoized; their memo slots kept in an int64 array);
2. ``storage_data`` (MetadataIndex → _StorageInfo per item, file by file, rank by rank) and the sparse data files;
3. ``all_local_plans`` (each rank's SavePlan: WriteItems whose chunk, properties and size are the objects of
   ``state_dict_metadata``, as in a real save where the metadata is built from the plans).

Memory is ~40 bytes per chunk (arrays) instead of ~1.5 KB of torch objects; the output loads with torch's
``FileSystemReader.read_metadata`` and equals what the object-building path (``--objects``) pickles (tested).
"""

from __future__ import annotations

import math
import os
import random
import uuid
from array import array
from pathlib import Path
from typing import Any, Optional

import numpy as np

from _metadata_stream import FS, MD, PLANNER, Batches, Emitter  # noqa: F401  (tools/ is on sys.path)

DCP_VERSION = "1.0.0"


def generate_streaming(spec: Any, out: Path, seed: int, plans: bool, real_headers: bool,
                       checkpoint_id: Optional[str] = None, log: Any = print) -> tuple[Any, dict[str, Any]]:
    import make_synthetic_ckpt as m
    from torch.distributed.checkpoint.planner import WriteItemType

    counts = m.stage_layer_counts(spec.layers, spec.pp)
    stages = [m.build_stage(spec, pp, counts) for pp in range(spec.pp)]
    for st in stages:
        st.buckets = m.bucketize(st.params, spec.bucket_size, spec.dp)
    payloads = m.Payloads(spec, seed, stages)
    save_id = str(uuid.UUID(int=random.Random(seed ^ 0x5EED).getrandbits(128), version=4))
    overhead = m._calibrate_overhead()
    isz_model = m._DTYPES[spec.param_dtype].itemsize

    def tlen(sizes: tuple[int, ...], isz: int) -> int:
        nb = math.prod(sizes) * isz
        return (nb - nb % 64 + overhead) if nb else overhead - 64

    tot = m.Totals()
    # ---- pass 1: keys and chunks -------------------------------------------------------------------------------
    key_ids: dict[str, int] = {}
    keys: list[str] = []
    kinds = bytearray()  # b"T" / b"B"
    gshapes: list[tuple[int, ...]] = []
    dtypes: list[str] = []
    intro_rank = array("q")
    ch_key, ch_nd, ch_off, ch_sz = array("q"), array("b"), array("q"), array("q")
    for rank, pp, items in m.iter_ranks(spec, stages, payloads):
        for it in items:
            k = key_ids.get(it[1])
            if k is None:
                k = key_ids[it[1]] = len(keys)
                keys.append(it[1])
                kinds.append(ord(it[0]))
                gshapes.append(tuple(it[4]) if it[0] == "T" else ())
                dtypes.append(str(it[5]).removeprefix("torch.") if it[0] == "T" else "")
                intro_rank.append(rank)
            if it[0] == "T":
                ch_key.append(k)
                ch_nd.append(len(it[2]))
                ch_off.extend(it[2])
                ch_sz.extend(it[3])
                tot.chunks += 1
                if it[6] is None:
                    tot.model_chunks += 1
                else:
                    tot.opt_chunks += 1
            else:
                tot.byte_items += 1
    log(f"  pass 1: {len(keys)} keys, {tot.chunks} chunks")
    ckey = np.frombuffer(ch_key, dtype=np.int64) if len(ch_key) else np.zeros(0, dtype=np.int64)
    order = np.argsort(ckey, kind="stable")
    per_key = np.bincount(ckey, minlength=len(keys)) if len(ckey) else np.zeros(len(keys), dtype=np.int64)
    key_start = np.concatenate(([0], np.cumsum(per_key)))
    nd = np.frombuffer(ch_nd, dtype=np.int8).astype(np.int64) if len(ch_nd) else np.zeros(0, dtype=np.int64)
    cstart = np.concatenate(([0], np.cumsum(nd)))
    off_all = np.frombuffer(ch_off, dtype=np.int64) if len(ch_off) else np.zeros(0, dtype=np.int64)
    sz_all = np.frombuffer(ch_sz, dtype=np.int64) if len(ch_sz) else np.zeros(0, dtype=np.int64)
    chunk_memo = np.zeros(len(ckey), dtype=np.int64)
    key_memo = np.zeros(len(keys), dtype=np.int64)
    props_memo = np.zeros(len(keys), dtype=np.int64)
    size_memo = np.zeros(len(keys), dtype=np.int64)

    tmp = out / ".metadata.tmp"
    with open(tmp, "wb") as f:
        e = Emitter(f)
        e.new(MD, "Metadata")
        e.begin_state()
        e.const("state_dict_metadata")
        e.buf += b"}"
        e.memoize()
        sb = Batches(e, setitems=True)
        for k, key in enumerate(keys):
            sb.before_item()
            key_memo[k] = e.text(key)
            if kinds[k] == ord("B"):
                e.new(MD, "BytesStorageMetadata")
            else:
                e.new(MD, "TensorStorageMetadata")
                e.begin_state()
                e.const("properties")
                props_memo[k] = e.properties(dtypes[k])
                e.const("size")
                size_memo[k] = e.size(gshapes[k])
                e.const("chunks")
                e.buf += b"]"
                e.memoize()
                lb = Batches(e, setitems=False)
                for c in order[key_start[k]:key_start[k + 1]].tolist():
                    a, b = cstart[c], cstart[c + 1]
                    lb.before_item()
                    chunk_memo[c] = e.chunk(tuple(off_all[a:b].tolist()), tuple(sz_all[a:b].tolist()))
                    lb.after_item()
                lb.close()
                e.end_state()
                tot.tensors += 1
            sb.after_item()
        sb.close()
        del order, off_all, sz_all
        log(f"  pass 1: state_dict_metadata written ({f.tell() / 1e6:.0f} MB)")

        # ---- pass 2: storage_data and the data files ---------------------------------------------------------
        e.const("planner_data")
        e.buf += b"N"
        e.const("storage_data")
        e.buf += b"}"
        e.memoize()
        sb = Batches(e, setitems=True)
        archiver = m.ArchiveWriter(out / ".synthetic_scratch") if real_headers else None

        def nbytes_of(it: tuple[Any, ...]) -> int:
            return math.prod(it[3]) * it[5].itemsize

        for rank, pp, items in m.iter_ranks(spec, stages, payloads):
            sfq: dict[str, int] = {}
            file_no = 0
            for b in m.split_files(items, spec.files_per_rank, nbytes_of):
                if not b:
                    continue
                rel = f"__{rank}_{file_no}.distcp"
                file_no += 1
                offset = 0
                path_memo: Optional[int] = None
                fh = open(out / rel, "wb") if archiver is not None else None
                for it in [it for it in b if it[0] == "B"] + [it for it in b if it[0] != "B"]:
                    key = it[1]
                    sb.before_item()
                    got = sfq.get(key)
                    if it[0] == "B":
                        lit = e.index(key if got is None else None, got, None, None)
                        length = it[2]
                    else:
                        lit = e.index(key if got is None else None, got, tuple(it[2]), it[6])
                        length = tlen(it[3], it[5].itemsize)
                    if lit is not None:
                        sfq[key] = lit
                    plit = e.storage_info(rel if path_memo is None else None, path_memo, offset, length)
                    if plit is not None:
                        path_memo = plit
                    sb.after_item()
                    if fh is not None:
                        if it[0] == "B":
                            fh.write(m._payload_bytes(payloads, it[3], pp))
                        else:
                            n = archiver.write_tensor(fh, it[3], it[5])  # type: ignore[union-attr]
                            if n != length:
                                raise AssertionError(f"archive size {n} != predicted {length}")
                    offset += length
                if fh is None:
                    with open(out / rel, "wb") as df:
                        df.truncate(offset)
                else:
                    fh.truncate(offset)
                    fh.close()
                tot.files += 1
                tot.data_bytes += offset
        sb.close()
        if archiver is not None:
            archiver.close()
        e.const("storage_meta")
        e.new(MD, "StorageMeta")
        e.begin_state()
        e.const("checkpoint_id")
        e.text(checkpoint_id if checkpoint_id is not None else str(out))
        e.const("save_id")
        e.text(save_id)
        e.const("load_id")
        e.buf += b"N"
        e.const("modules")
        e.buf += b"]"
        e.memoize()
        e.end_state()
        e.const("version")
        e.text(DCP_VERSION)
        log(f"  pass 2: storage_data written ({f.tell() / 1e6:.0f} MB), {tot.files} data files")

        # ---- pass 3: all_local_plans -------------------------------------------------------------------------
        if plans:
            e.const("all_local_plans")
            e.buf += b"]"
            e.memoize()
            pb = Batches(e, setitems=False)
            seen = np.zeros(len(keys), dtype=bool)
            seq = 0
            shard, byte_io = WriteItemType.SHARD.value, WriteItemType.BYTE_IO.value
            for rank, pp, items in m.iter_ranks(spec, stages, payloads):
                pb.before_item()
                e.new(PLANNER, "SavePlan")
                e.begin_state()
                e.const("items")
                e.buf += b"]"
                e.memoize()
                ib = Batches(e, setitems=False)
                pfq: dict[str, int] = {}
                for it in items:
                    key = it[1]
                    k = key_ids[key]
                    ib.before_item()
                    got = pfq.get(key)
                    if got is None and intro_rank[k] == rank:
                        got = pfq[key] = int(key_memo[k])  # the plan's fqn string is the metadata key
                    if it[0] == "T":
                        first = not seen[k]
                        seen[k] = True
                        lit = e.write_item(key if got is None else None, got, tuple(it[2]), it[6], shard,
                                           int(chunk_memo[seq]), int(props_memo[k]) if first else None,
                                           int(size_memo[k]) if first else None, dtypes[k], gshapes[k])
                        seq += 1
                    else:
                        lit = e.write_item(key if got is None else None, got, None, None, byte_io, None, None, None,
                                           "", ())
                    if lit is not None:
                        pfq[key] = lit
                    ib.after_item()
                    tot.plan_items += 1
                ib.close()
                e.const("storage_data")
                e.buf += b"N"
                e.const("planner_data")
                e.buf += b"}"
                e.memoize()
                e.const("usable")
                e.buf += b"\x88"
                e.end_state()
                pb.after_item()
            pb.close()
            log(f"  pass 3: all_local_plans written ({tot.plan_items} items)")
        e.end_state()
        e.stop()
    os.replace(tmp, out / ".metadata")
    return tot, {"save_id": save_id}
