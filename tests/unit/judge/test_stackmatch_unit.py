"""Which thread's stack is a rank's evidence (judge/stackmatch.training_thread).
Pure: dumps built in the shape py-spy gives them (innermost frame first). A real
job that trains off its main thread: tests/thirdparty/test_ray_jobs.py (Ray Train)."""
from __future__ import annotations

from ddpwatch.judge.stackmatch import classify_stack, training_thread
from ddpwatch.observe.probes.stacks import Frame, PidStacks, ThreadStack

SITE = "/venv/lib/python3.11/site-packages"
PID = 4242


def frame(name: str, path: str, line: int = 10) -> Frame:
    return Frame(name, path, "", path.rsplit("/", 1)[-1], line)


def thread(tid: int, name: str, *frames: Frame, active: bool = False) -> ThreadStack:
    return ThreadStack(tid, tid, name, active, False, tuple(frames))


RAY_MAIN = thread(PID, "MainThread",
                  frame("main_loop", f"{SITE}/ray/_private/worker.py", 946),
                  frame("<module>", f"{SITE}/ray/_private/workers/default_worker.py", 330))
TRAINING = thread(PID + 7, "TrainingThread",
                  frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2950),
                  frame("train_func", "/home/me/train_ray.py", 41),
                  frame("run", f"{SITE}/ray/train/_internal/utils.py", 120))
PIN = thread(PID + 3, "Thread-2 (_pin_memory_loop)",
             frame("_pin_memory_loop", f"{SITE}/torch/utils/data/_utils/pin_memory.py", 52),
             frame("run", "/usr/lib/python3.11/threading.py", 982))


def dump(*threads: ThreadStack) -> PidStacks:
    return PidStacks(PID, "ok", "S", False, threads)


def test_a_main_thread_idle_in_a_worker_pools_loop_gives_way_to_the_thread_that_trains():
    d = dump(RAY_MAIN, PIN, TRAINING)
    assert training_thread(d) is TRAINING
    assert classify_stack(d) == "collective"


def test_a_main_thread_that_trains_is_the_evidence_whatever_other_threads_do():
    main = thread(PID, "MainThread",
                  frame("sleep", "/home/me/train.py", 12),
                  frame("<module>", "/home/me/train.py", 80))
    d = dump(main, TRAINING)
    assert training_thread(d) is main  # the user's own code: a pause of its own
    assert classify_stack(d) == "idle_user"


def test_torchs_helper_threads_are_no_training():
    """A DataLoader's pin-memory thread has torch frames; with a main thread in
    library code only it is still not taken for the training."""
    d = dump(RAY_MAIN, PIN)
    assert training_thread(d) is RAY_MAIN


def test_of_several_threads_the_one_in_a_collective_is_taken():
    user = thread(PID + 9, "logger", frame("flush", "/home/me/log.py", 5))
    d = dump(RAY_MAIN, user, TRAINING)
    assert training_thread(d) is TRAINING


def test_a_dumps_reading_is_kept_while_the_dump_lives_and_dropped_with_it():
    """judge/memo.py per_dump: the daemon judges a kept dump again every tick;
    what it reads of it is worked out once, and nothing outlives the dump."""
    import gc
    d = dump(RAY_MAIN, PIN, TRAINING)
    memo = classify_stack.memo
    assert classify_stack(d) == "collective" and id(d) in memo
    assert training_thread(d) is TRAINING and id(d) in training_thread.memo
    assert classify_stack(d) == "collective"  # from the memo
    other = dump(thread(PID, "MainThread", frame("sleep", "/home/me/train.py", 12)))
    assert classify_stack(other) == "idle_user"  # another dump: its own reading
    key = id(d)
    del d
    gc.collect()
    assert key not in memo and key not in training_thread.memo
