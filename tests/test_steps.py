"""Script mode's side of the user's script (``autotune.steps``): ``Tuned.step`` tells a trial's pipe each optimizer
step's end and samples and the loss once; a script outside a trial, or one whose search closed the pipe, trains on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autotune.steps import LOSS_SAMPLES, STEPS, Effect, Evaluation, Loss, Model, Step, StepReporter, decode

REPO = Path(__file__).resolve().parent.parent


def test_a_users_script_tells_its_steps_and_its_loss_once_over_the_trials_pipe(facts, tmp_path) -> None:
    """``examples/train_cnn.py`` (the README's ``apply()`` pattern, unchanged) under a trial's pipe, started by
    torchrun (which closes inherited descriptors: the pipe is named): one line a step, the steps' ends on the
    machine's monotonic clock within the script's life, their samples its batch, and the loss at the first step
    that reaches 256 samples."""
    from autotune import search_spaces as spaces
    from autotune.recipe import Recipe

    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=64)), "device": "cpu",
              "reference_batch": 64}
    recipe = Recipe(params=params, workload="examples/train_cnn.py", fingerprint=facts.fingerprint)
    pipe = tmp_path / "steps"
    os.mkfifo(pipe)
    read = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    env = {**os.environ, "AUTOTUNE_RECIPE": json.dumps(recipe.to_dict()), STEPS: str(pipe), LOSS_SAMPLES: "256",
           "TRAIN_S": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           str(REPO / "examples" / "train_cnn.py")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    with os.fdopen(read, "rb") as told:
        messages = [decode(line) for line in told.read().decode().splitlines()]
    assert done.returncode == 0, done.stderr
    steps = [m for m in messages if isinstance(m, Step)]
    losses = [m for m in messages if isinstance(m, Loss)]
    assert len(steps) >= 6 and all(started < s.ended < time.monotonic() for s in steps)
    pairs = list(zip(steps, steps[1:], strict=False))
    assert [b.samples - a.samples for a, b in pairs] == [64] * len(pairs)
    assert all(b.ended > a.ended for a, b in pairs)
    assert len(losses) == 1 and losses[0].samples == 256 and 0 < losses[0].value < 10, losses
    assert [m for m in messages if isinstance(m, Effect)] == [Effect(params["threads"])]  # the recipe's, once
    assert [m for m in messages if isinstance(m, Model)] == [Model(conv=True, conv_nd=False)]
    assert messages.index(losses[0]) == messages.index(steps[3]) + 1 and steps[3].samples == 256  # after its step
    (figure,) = [m for m in messages if isinstance(m, Evaluation)]  # its validation loss (tuned.evaluate), once
    assert messages.index(figure) == messages.index(losses[0]) + 1 and figure.samples == 256 and 0 < figure.value < 10
    assert figure.took_s > 0 and steps[4].waited < figure.took_s  # the evaluation's time was no wait for data
    # train_cnn.py moves its batches with tuned.to_device: the wait before each batch is told (a tensor dataset's
    # batches come at once: a small part of the step)
    spans = [b.ended - a.ended for a, b in pairs]
    assert all(0 <= s.waited for s in steps) and 0 < sum(s.waited for s in steps[1:]) < 0.5 * sum(spans)


def test_micro_batches_add_up_to_the_step_and_a_closed_pipe_is_no_error() -> None:
    read, write = os.pipe()
    reporter = StepReporter(write)
    for _ in range(2):  # two accumulated micro-batches of 32: one optimizer step of 64
        reporter.micro(32)
    reporter.stepped(None)  # no loss asked: the loss is never read
    told = [decode(line) for line in os.read(read, 4096).decode().splitlines()]
    assert told == [Step(told[0].ended, 64), Effect(torch.get_num_threads())], told  # type: ignore[union-attr]
    os.close(read)  # the search went away
    reporter.micro(32)
    reporter.stepped(None)  # EPIPE: swallowed, and nothing more is written
    assert reporter.fd is None
    os.close(write)


def test_outside_a_trial_nothing_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune

    monkeypatch.delenv(STEPS, raising=False)
    assert StepReporter.from_environment() is None
    assert autotune.apply({"batch_size": 8}, check_hardware=False)._steps is None


def test_a_pipe_no_one_reads_is_no_reporter_and_a_file_is_never_written(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    pipe, plain = tmp_path / "steps", tmp_path / "notes.txt"
    os.mkfifo(pipe)
    monkeypatch.setenv(STEPS, str(pipe))
    assert StepReporter.from_environment() is None  # the search has gone: the script trains on untold
    plain.write_text("the user's")
    monkeypatch.setenv(STEPS, str(plain))
    with pytest.raises(RuntimeError, match="not a named pipe"):
        StepReporter.from_environment()
    assert plain.read_text() == "the user's"


def test_an_evaluation_is_told_with_the_loss_and_its_time_is_no_wait_for_data() -> None:
    """A script's own figure (``Tuned.evaluate``) is taken at the step where the loss is due, told right after the
    loss with the seconds it took, and the wait for the next batch is counted from its end."""
    read, write = os.pipe()
    reporter = StepReporter(write, loss_samples=8)
    reporter.evaluator = (lambda: time.sleep(0.2) or 0.75, True)
    reporter.micro(8)
    reporter.stepped(torch.tensor(2.0))
    reporter.batch()  # the next batch came at once
    reporter.micro(8)
    reporter.stepped(torch.tensor(1.0))
    told = [decode(line) for line in os.read(read, 4096).decode().splitlines()]
    os.close(read)
    os.close(write)
    assert [type(m).__name__ for m in told] == ["Step", "Effect", "Loss", "Evaluation", "Step"], told
    figure = told[3]
    assert isinstance(figure, Evaluation) and (figure.samples, figure.value, figure.higher_is_better) == (8, 0.75, True)
    assert figure.took_s >= 0.2 and told[4].waited < 0.1, told  # type: ignore[union-attr]


def test_a_copy_switches_to_the_recipe_the_search_sends_between_two_steps_and_refuses_what_cannot_change() -> None:
    """``AUTOTUNE_CONTROL``: the search sends recipes; the copy's next ``step`` switches to each it can (precision
    and memory layout in place: the model's weights and its optimizer's state converted, the next forward pass under
    the new autocast) and answers each, naming the knobs it cannot change (a DataLoader's workers are made when the
    script builds it)."""
    from autotune.apply import Tuned
    from autotune.steps import Switched, encode_switch

    read, write = os.pipe()
    orders, send = os.pipe()
    os.set_blocking(orders, False)
    reporter = StepReporter(write)
    reporter.control = orders
    params = {"amp_dtype": "float32", "channels_last": False, "batch_per_rank": 8, "num_workers": 0, "device": "cpu"}
    tuned = Tuned(params=dict(params), _steps=reporter)
    model = tuned.prepare_model(torch.nn.Conv2d(3, 4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    faster = {**params, "amp_dtype": "bfloat16", "channels_last": True}
    os.write(send, (encode_switch(1, faster) + encode_switch(2, {**faster, "num_workers": 2})).encode())
    x = torch.randn(8, 3, 8, 8)
    for _ in range(2):
        with tuned.autocast():
            out = model(*tuned.to_device(x))
        tuned.step(out.float().mean(), optimizer)
    told = [decode(line) for line in os.read(read, 1 << 16).decode().splitlines()]
    for fd in (read, write, orders, send):
        os.close(fd)
    assert [m for m in told if isinstance(m, Switched)] == [
        Switched(1), Switched(2, "num_workers cannot change in a running process")], told
    assert [type(m).__name__ for m in told] == ["Model", "Step", "Effect", "Switched", "Switched", "Step"]  # between
    assert tuned.params == faster and out.dtype == torch.bfloat16  # the second step's forward pass: switched
    assert model.weight.is_contiguous(memory_format=torch.channels_last)
    # the momentum its first step made follows the weights' layout (else each update mixed the two)
    assert optimizer.state[model.weight]["momentum_buffer"].is_contiguous(memory_format=torch.channels_last)


def test_a_step_tells_the_batch_it_moved_only_where_the_batch_leads_its_tensors() -> None:
    """A batch's first dimension is the step's samples (an epoch's short last one too), never more than the recipe's
    batch: batches that lead with time (a GRU's (time, batch, ...)) or a whole data set moved once are not counted as
    more (too few reads a recipe slower, never faster), and a batch switch is refused (its steps could not show it)."""
    from autotune.apply import Tuned
    from autotune.steps import Step

    def told(*moved: torch.Tensor) -> tuple[list[int], str | None]:
        read, write = os.pipe()
        reporter = StepReporter(write)
        tuned = Tuned(params={"batch_per_rank": 8, "device": "cpu"}, _steps=reporter)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for batch in moved:
            (x,) = tuned.to_device(batch)
            tuned.step(model(x.reshape(-1, 4)).mean(), optimizer)
        steps = [m for m in map(decode, os.read(read, 1 << 16).decode().splitlines()) if isinstance(m, Step)]
        why = tuned.switch({**tuned.params, "batch_per_rank": 16})
        os.close(read)
        os.close(write)
        return [b.samples - a.samples for a, b in zip([Step(0.0, 0, 0.0), *steps], steps, strict=False)], why

    assert told(torch.randn(8, 4), torch.randn(3, 4)) == ([8, 3], None)
    time_first, why = told(torch.randn(5, 8, 4), torch.randn(12, 8, 4))
    assert time_first == [5, 8] and why is not None and "to_device" in why
    whole, why = told(torch.randn(1000, 4))
    assert whole == [8] and why is not None
    # a script whose DataLoader keeps its batch (8) under a recipe of 16: its steps tell the 8 it trains
    reporter = StepReporter(os.open(os.devnull, os.O_WRONLY))
    tuned = Tuned(params={"batch_per_rank": 16, "device": "cpu"}, _steps=reporter)
    tuned.to_device(torch.randn(8, 4))
    assert reporter.samples_of() == 8
    os.close(reporter.fd)  # type: ignore[arg-type]


def test_an_evaluations_time_starts_after_the_loss_is_read() -> None:
    """On a GPU reading the loss waits for the queued steps: training time, not the evaluation's."""
    class Queued:  # a loss whose read waits 0.2 s
        def detach(self) -> torch.Tensor:
            time.sleep(0.2)
            return torch.tensor(1.0)

    read, write = os.pipe()
    reporter = StepReporter(write, loss_samples=8)
    reporter.evaluator = (lambda: 0.5, False)
    reporter.micro(8)
    reporter.stepped(Queued())
    told = [decode(line) for line in os.read(read, 4096).decode().splitlines()]
    os.close(read)
    os.close(write)
    figure = told[-1]
    assert isinstance(figure, Evaluation) and figure.took_s < 0.1, told


def test_a_line_on_the_step_channel_that_is_no_message_is_skipped_not_fatal(tmp_path: Path) -> None:
    """A process that inherited the channel (a tool the script starts) may write on it: a line that is no message,
    not UTF-8, or a step at a time that is no time ended the whole search; it is skipped, the first one kept."""
    from autotune.measure.script.copies import ScriptRun

    run = ScriptRun(None, tmp_path)  # type: ignore[arg-type]  # read() alone: nothing started
    reader, writer = os.pipe()
    os.set_blocking(reader, False)
    run._read = reader
    os.write(writer, b"hello from a child\n\xff\xfe\nstep nan 64\n\nstep 1.5 64\nloss 64 nan\n")
    run.read()
    assert run.steps == [Step(1.5, 64)] and run.stray == b"hello from a child"
    assert run.loss is not None and run.loss.samples == 64  # a loss may be NaN: a diverged training is told so
    os.close(writer)
    os.close(reader)
    assert decode("step 1.5 64") == Step(1.5, 64)
