"""Burst admission (CUDA's ``burst_chunks``, forced here on the CPU): when many requests
arrive at few decoding rows, one prefill group takes several chunks' tokens per step,
every row still at most one chunk's columns per step."""

from __future__ import annotations

from mlxcel.testing.engine import run_until_done, solo_outputs, submit, worker_for

BURST = [[20 + i] * 12 for i in range(10)]  # 12 tokens to prefill each


def record_steps(worker, job) -> list[int]:
    cols, step = [], job.step

    def recording(chunk, max_cols=None):
        done = step(chunk, max_cols)
        cols.append(job.last_cols)
        return done

    job.step = recording
    return cols


def test_without_burst_chunks_the_budget_is_one_chunk(path):
    worker = worker_for(path, cache=False, chunk=16, parallel=12)
    assert worker.burst_chunks == 1  # CPU default
    for prompt in BURST:
        submit(worker, prompt)
    worker._drain(block=False)
    assert worker._budget(worker._free()) == 16
    assert len(worker._admit().seqs) == 1  # 2 x 12 > 16


def test_a_burst_at_one_decoding_row_prefills_in_one_group(path):
    expected = solo_outputs(path, BURST[:3], chunk=16)
    worker = worker_for(path, cache=False, chunk=16, parallel=12, burst_chunks=8)
    running = submit(worker, list(range(3, 13)), max_tokens=40)
    for _ in range(3):
        worker.step()
    assert len(worker.batch) == 1
    sinks = [submit(worker, p) for p in BURST]
    worker._drain(block=False)
    # 10 arriving at 1 decoding row: 8 chunks (capped), 128 tokens, 10 rows of 12 fit
    assert worker._budget(worker._free()) == 128
    job = worker._admit()
    assert len(job.seqs) == 10
    cols = record_steps(worker, job)
    worker.prefilling = job
    before = len(running.tokens)
    run_until_done(worker, sinks)
    assert cols == [12]  # one step for the whole burst
    assert [s.tokens for s in sinks[:3]] == expected
    assert all(len(s.tokens) == 6 for s in sinks)
    assert len(running.tokens) > before


def test_burst_rows_take_at_most_one_chunk_of_columns_per_step(path):
    prompts = [[30 + i] + list(range(3, 42)) for i in range(4)]  # 40 tokens to prefill each
    expected = solo_outputs(path, prompts, chunk=16)
    worker = worker_for(path, cache=False, chunk=16, parallel=12, burst_chunks=8)
    sinks = [submit(worker, p) for p in prompts]
    worker._drain(block=False)
    assert worker._budget(worker._free()) == 128  # nothing decoding: all 8 chunks
    job = worker._admit()
    assert len(job.seqs) == 4
    cols = record_steps(worker, job)
    worker.prefilling = job
    run_until_done(worker, sinks)
    assert cols == [16, 16, 8]
    assert [s.tokens for s in sinks] == expected


def test_a_long_prompt_arriving_alone_still_prefills_a_chunk_per_step(path):
    worker = worker_for(path, cache=False, chunk=16, parallel=12, burst_chunks=8)
    running = submit(worker, list(range(3, 13)), max_tokens=40)
    for _ in range(3):
        worker.step()
    long = submit(worker, list(range(3, 60)))  # 57 tokens to prefill
    worker._drain(block=False)
    # 1 arriving at 1 decoding row: 8 chunks, but a row computes one chunk's columns a step
    assert worker._budget(worker._free()) == 128
    job = worker._admit()
    cols = record_steps(worker, job)
    worker.prefilling = job
    before = len(running.tokens)
    run_until_done(worker, [long])
    assert cols == [16, 16, 16, 9]
    # the running row got a token with every chunk
    assert len(running.tokens) >= before + len(cols)


def test_held_rows_do_not_shrink_the_next_burst_group(path):
    """A burst larger than one group: the rest forms one group too, since the first
    group's rows (held back to join, as on CUDA) decode nothing yet."""
    worker = worker_for(path, cache=False, chunk=16, parallel=16, burst_chunks=8,
                        hold_groups=True)
    running = submit(worker, list(range(3, 13)), max_tokens=40)
    for _ in range(3):
        worker.step()
    groups = []
    admit = worker._admit

    def recording(plan=None):
        job = admit(plan)
        if job is not None:
            groups.append(len(job.seqs))
        return job

    worker._admit = recording
    sinks = [submit(worker, [20 + i] * 12) for i in range(14)]  # 12 tokens each
    run_until_done(worker, sinks)
    assert groups == [10, 4]  # 128 tokens: 10 rows; then 4 arriving at 1 decoding row
    assert all(len(s.tokens) == 6 for s in sinks) and not running.done


def test_requests_arriving_during_a_prefill_join_with_its_group(path):
    """Where groups are held (CUDA), requests that reach the engine while a group
    prefills hold that group back: both groups join the batch in one join, and every row
    gets its solo tokens."""
    prompts = [[30 + i] * 12 for i in range(3)]
    late_prompts = [[40 + i] * 9 for i in range(2)]
    for hold in (True, False):
        worker = worker_for(path, cache=False, chunk=64, parallel=8, hold_groups=hold)
        running = submit(worker, list(range(3, 13)), max_tokens=30)
        for _ in range(3):
            worker.step()
        joins = []
        join = worker.batch.join
        worker.batch.join = lambda jobs, joins=joins, join=join: (
            joins.append([len(j.seqs) for j in jobs]), join(jobs))[1]
        sinks = [submit(worker, p) for p in prompts]
        late: list = []
        admit = worker._admit

        def admitting(plan=None, admit=admit, late=late, worker=worker):
            job = admit(plan)
            if job is not None and not late:  # these arrive while the first group prefills
                step = job.step

                def step_and_arrive(chunk, max_cols=None):
                    late.extend(submit(worker, p) for p in late_prompts)
                    job.step = step
                    return step(chunk, max_cols)

                job.step = step_and_arrive
            return job

        worker._admit = admitting
        run_until_done(worker, sinks)
        run_until_done(worker, late)
        assert joins == ([[3, 2]] if hold else [[3], [2]])
        assert [s.tokens for s in [*sinks, *late]] == solo_outputs(path, prompts + late_prompts)
        assert not running.done
