"""Distributed serving in one process: rank 0's record and a follower's replay of it (two
workers on one tiny checkpoint, the broadcast replaced by a list), the prompt cache's
journal, the messages, the launcher wrapper and the mode checks. The real ranks over the
ring backend are tests/test_e2e_distributed*.py."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlxcel import cli
from mlxcel.engine.cache.kvcache import KVRows
from mlxcel.engine.cache.prompt_cache import BLOCK_SIZE, PromptCache
from mlxcel.engine.distributed import launcher, messages, sharding
from mlxcel.engine.distributed.follower import Follower
from mlxcel.engine.distributed.leader import Leader
from mlxcel.errors import StartupError
from mlxcel.testing.engine import run_until_done, submit, worker_for


class Wire:
    """Both ends of the broadcast in one process: rank 0 appends, the follower pops."""

    def __init__(self, rank: int, sent: list[bytes]) -> None:
        self.rank, self.size, self.mode, self.sent = rank, 2, "tensor", sent

    def send(self, payload: bytes) -> None:
        self.sent.append(payload)

    def share_tokens(self, sampled):
        return sampled


# the CUDA policy's plan-shaping choices, forced on the CPU: groups held to join together,
# a burst budget, finished rows kept until they are the majority, aligned prefill columns
CUDA_PLANS = {"hold_groups": True, "burst_chunks": 4, "lazy_leave": True,
              "prefill_align": 32, "emit_first": True}


def pair(checkpoint, **policy):
    """Rank 0's worker (``Leader`` hooks) and a follower's, on one checkpoint (the same
    ``policy`` changes on both, as the start-up agreement makes them)."""
    sent: list[bytes] = []
    lead = worker_for(checkpoint, cache=True, parallel=3, **policy)
    follow = worker_for(checkpoint, parallel=3, **policy)
    lead.dist = Leader(lead, Wire(0, sent), timeout=60)
    follow.dist = Follower(follow, Wire(1, sent), timeout=60)
    lead.batch, follow.batch = lead._new_batch(), follow._new_batch()
    return lead, follow, sent


def replay(follow, sent: list[bytes]) -> int:
    ops = 0
    while sent:
        for op in messages.decode_message(sent.pop(0)).ops:
            follow.dist.apply(op)
            ops += 1
    return ops


def drive(lead, follow, sent, sinks, cancel=None) -> None:
    for step in range(2000):
        if all(s.done for s in sinks):
            break
        if cancel is not None and step == 6:
            cancel.cancelled = True
        lead.step()
        replay(follow, sent)
    lead.step()  # idle: what is left is sent at once
    replay(follow, sent)


def same_state(lead, follow) -> None:
    assert [s.order for s in lead.batch.rows] == [s.order for s in follow.batch.rows]
    ids = list(lead.prompt_cache._entries)
    assert ids and ids == list(follow.dist.entries)
    for entry_id in ids:
        mine, theirs = lead.prompt_cache._entries[entry_id].payload, \
            follow.dist.entries[entry_id]
        assert isinstance(theirs, KVRows)  # the same model on the same rows: the same KV
        assert mx.array_equal(mine.keys, theirs.keys) and mx.array_equal(mine.values,
                                                                          theirs.values)


@pytest.mark.parametrize("policy", [{}, CUDA_PLANS], ids=["cpu", "cuda-plans"])
def test_a_follower_replays_rank_0_batches_cache_hits_and_evictions(tiny_checkpoint, policy):
    lead, follow, sent = pair(tiny_checkpoint, **policy)
    prompts = [list(range(5, 5 + n)) for n in (40, 23, 57, 33)]
    sinks = [submit(lead, p, max_tokens=8 + i) for i, p in enumerate(prompts)]
    drive(lead, follow, sent, sinks, cancel=sinks[3])
    assert sinks[3].last.finish_reason == "cancelled"
    same_state(lead, follow)
    # the next turn of the first conversation reuses its stored KV, on both ranks
    again = [*prompts[0], *sinks[0].tokens, 7, 8, 9]
    sink = submit(lead, again, max_tokens=5)
    drive(lead, follow, sent, [sink])
    assert sink.last.usage.cached_tokens >= BLOCK_SIZE
    same_state(lead, follow)
    lead.prompt_cache.reset()  # a reset from HTTP reaches the follower with the next message
    lead.step()
    replay(follow, sent)
    assert follow.dist.entries == {} and not sent


def test_rank_0_sends_before_each_collective_step_and_pings_when_idle(tiny_checkpoint):
    lead, follow, sent = pair(tiny_checkpoint)
    sink = submit(lead, list(range(5, 30)), max_tokens=3)
    run_until_done(lead, [sink], settle=True)
    kinds = [[type(op).__name__ for op in messages.decode_message(p).ops] for p in sent]
    assert kinds[0] == ["Admit", "PrefillStep"]
    steps = ("Launch", "PrefillStep")  # a collective step ends the message it is in
    assert all(k.index(op) == len(k) - 1 for k in kinds for op in steps if op in k)
    assert kinds[-1][:2] == ["ReadBack", "Finish"]  # going idle: the rest at once
    assert sum(k.count("Launch") for k in kinds) == sum(k.count("ReadBack") for k in kinds)
    lead.dist.last_sent -= 5  # long idle: an empty message tells the followers it lives
    sent.clear()
    lead.step()
    assert [messages.decode_message(p).ops for p in sent] == [()]


def test_the_prompt_cache_journal_names_every_change_in_order():
    cache = PromptCache(10_000, max_entries=2)
    cache.journal = []

    class Payload:
        nbytes = 100

        def prefix(self, n):
            return self

    tokens = [list(range(i, i + 2 * BLOCK_SIZE + 3)) for i in (0, 100, 200)]
    for t in tokens:
        assert cache.insert(t, Payload())
    events = cache.drain_journal()
    inserts = [e for e in events if e[0] == 0]
    assert [e[2] for e in inserts] == [0, 1, 2]  # each store names its insert call
    assert all(e[3] == 2 * BLOCK_SIZE for e in inserts)  # cut to whole blocks
    assert (1, inserts[0][1]) in events  # max_entries=2: the first one left
    cache.reset()
    assert cache.drain_journal() == [(2,)] and cache.drain_journal() == []


def test_messages_round_trip():
    msg = messages.Message((messages.Admit((messages.Row(3, (1, 2, 3), 7, 16),)),
                            messages.PrefillStep(512, 512), messages.Finish((3, 4)),
                            messages.Store((3,), ((0, 9, 0, 16), (1, 2))), messages.Stop()))
    assert messages.decode_message(messages.encode(msg)) == msg


def test_launch_runs_mlx_launch_with_mlxcel_server_on_every_rank():
    args = launcher.launch_parser().parse_args(["--hostfile", "h.json", "--backend", "jaccl"])
    argv = launcher.launcher_argv(args, ["--model", "m", "--distributed", "tensor"])
    split = argv.index("--")
    assert argv[:split] == ["--hostfile", "h.json", "--backend", "jaccl"]
    assert argv[split + 1].endswith("mlxcel-server") and argv[-2:] == ["--distributed",
                                                                        "tensor"]
    with pytest.raises(StartupError, match="must set --distributed"):
        cli.check_launched_args(["--model", "m"])


def test_launch_exits_with_the_first_failing_rank_status():
    prog = "import os, sys; sys.exit(3 if os.environ['MLX_RANK'] == '1' else 0)"
    code = ("import sys; from mlxcel.engine.distributed.launcher import run_mlx_launch; "
            f"sys.exit(run_mlx_launch(['-n', '2', '--hosts', '127.0.0.1', '--', "
            f"{sys.executable!r}, '-c', {prog!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 3, proc.stderr


def test_the_launcher_rank_comes_from_its_environment(monkeypatch):
    for name in launcher.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert launcher.launcher_rank() == 0
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    assert launcher.launcher_rank() == 2


def test_a_mode_the_model_lacks_or_heads_that_do_not_split_refuse_to_start():
    both = SimpleNamespace(shard=lambda g: None, model=SimpleNamespace(pipeline=lambda g: None))
    tensor_only = SimpleNamespace(shard=lambda g: None, model=SimpleNamespace())
    assert sharding.supported(both) == ["tensor", "pipeline"]
    sharding.check(both, {"model_type": "x"}, "pipeline")
    with pytest.raises(StartupError, match="supports tensor only"):
        sharding.check(tensor_only, {"model_type": "x"}, "pipeline")
    with pytest.raises(StartupError, match="num_key_value_heads = 2 does not split over 4"):
        sharding.check_split({"num_attention_heads": 8, "num_key_value_heads": 2}, "tensor", 4)
    sharding.check_split({"num_key_value_heads": 2}, "pipeline", 4)


def test_the_ring_s_ports_are_free_consecutive_and_outside_the_ephemeral_range():
    """A port the kernel may give an outgoing connection could be taken before a rank
    binds it (a test once failed so, EADDRINUSE): the ring's come from below that range."""
    import socket

    from mlxcel.testing.distributed import RING_PORTS, free_ports

    for _ in range(20):
        ports = free_ports(3)
        assert ports == list(range(ports[0], ports[0] + 3))
        assert RING_PORTS[0] <= ports[0] and ports[-1] < RING_PORTS[1] <= 32768
    for port in ports:  # still bindable: nothing holds them
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
