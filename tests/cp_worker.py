"""The ranks of the gloo tests of fa_variants.distributed (started by tests/test_distributed.py).

    python tests/cp_worker.py WORLD CASES_FILE OUT_DIR

One interpreter imports torch once and forks WORLD ranks before any torch computation (importing torch in
each of 4 fresh processes costs ~4x the time on a small CI machine). The ranks meet through a file store in
OUT_DIR and gloo on the loopback interface. CASES_FILE (torch.save) holds a list of cases, each {"name",
"args": [per-rank (q, k, v)], "kwargs": [per-rank dict], "group": "world" | "self", optional
"overlap_start": the value of distributed.OVERLAP_START for the case, default True}. Every rank calls
context_parallel_attention on its own arguments for every case in order and saves {name: (out, lse) or
("error", type name, message)} to OUT_DIR/rank{RANK}.pt. An error does not stop the run: the later cases
show that the group is still usable after it. Exit status 0 iff every rank finished within TIMEOUT_S.
"""
import datetime
import multiprocessing
import sys

import torch
import torch.distributed as dist

from fa_variants import distributed
from fa_variants.distributed import context_parallel_attention

TIMEOUT_S = 90


def run_rank(rank: int, world: int, cases: list, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    singles = [dist.new_group([r]) for r in range(world)]  # every rank creates every group, in order
    results = {}
    for case in cases:
        q, k, v = case["args"][rank]
        # "other": a group of one that this rank is not in (new_group gave it torch's non-member sentinel)
        group = {"self": singles[rank], "other": singles[(rank + 1) % world]}.get(case["group"])
        distributed.OVERLAP_START = case.get("overlap_start", True)
        try:
            results[case["name"]] = context_parallel_attention(q, k, v, group=group, return_lse=True,
                                                               **case["kwargs"][rank])
        except Exception as error:  # recorded for the test to judge (type and message)
            results[case["name"]] = ("error", type(error).__name__, str(error))
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    world, cases_file, out_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    cases = torch.load(cases_file)
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=run_rank, args=(r, world, cases, out_dir)) for r in range(world)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(TIMEOUT_S)
    status = 0
    for r, p in enumerate(ranks):
        if p.is_alive():
            print(f"rank {r} still running after {TIMEOUT_S} s: terminated", flush=True)
            p.terminate()
            p.join()
        if p.exitcode != 0:
            print(f"rank {r} exit code {p.exitcode}", flush=True)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
