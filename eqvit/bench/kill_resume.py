"""Stop a real ``eqvit train`` at random moments (kill -9, SIGINT, SIGTERM), resume it, compare bit for bit.

In a temporary folder (with its own shallow-water data cache) a tiny run (``so3vit_tiny`` with
``residual: true``, batch 2, two validation samples, one thread, ``--steps`` steps, a checkpoint every
``--checkpoint-every`` steps) is trained once, uninterrupted, with the real command line
(``python -m eqvit train CFG --out DIR``): the reference. Then each try

1. starts the same command into a folder of its own and stops it with a signal, round robin over SIGKILL,
   SIGINT and SIGTERM (the child has the default handlers a terminal gives it, even when this benchmark
   runs in the background), at a moment drawn with ``random.Random(--seed)``: two tries in three wait a
   random delay after the run's progress bar appeared, from half a second before it (the model and the
   data are ready, the output folder is made) through the steps, the final checkpoint and into the final
   evaluation (the reference's span from its bar to its last step, plus half a second); one in three aims
   at a periodic checkpoint write: 0 to 4 ms after the temporary of its ``last.safetensors`` or of its
   sidecar ``last.json`` (between the checkpoint's two renames) appeared;
2. records the exit code (SIGKILL: -9, the kernel's; SIGINT / SIGTERM: the CLI's 130 / 143 once it saved
   the last completed step, or -2 / -15 when the signal landed before the CLI set its handlers, a delay drawn
   before the reference's bar on a try that started slower; 0 when the run had finished), the step of
   ``last.safetensors`` if there is one, and the temporaries left behind (a SIGKILL inside a checkpoint write
   leaves its ``.NAME.XXXXXXXX.tmp``);
3. runs ``--resume`` until the run completes (at most ``--max-resumes`` times); with probability
   ``--resume-kill-rate`` the first resume is itself stopped, once, by a random signal after a random delay.
   ``--resume`` in a folder without ``last.safetensors`` (stopped before its first checkpoint) starts the run
   from step 0: the CLI prints ``no checkpoint in OUT; starting from scratch`` (``fresh_start`` in the row);
4. compares the finished run with the reference: the losses of ``history.csv`` (step and value) and every
   ``model.*`` and ``optim.*`` tensor of ``last.safetensors`` (:func:`torch.equal`). A try is exact only if
   all of them are equal; otherwise its row says what differs.

Writes JSON (``tries``, ``exact``, ``by_signal`` with the exit codes seen, a row per try, the load averages
at the start and the end, the date and the machine) and prints a table. Exits 1 when a try is not exact.

Usage: ``python benchmarks/kill_resume.py [--tries 30] [--seed 0] [--steps 16] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eqvit.bench._paths import results_dir

SIGNALS = ("SIGKILL", "SIGINT", "SIGTERM")
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # what the children import eqvit from

TINY_RUN: dict[str, Any] = {
    "model": {"name": "so3vit_tiny", "kwargs": {"residual": True}},
    "data": {"batch_size": 2, "num_val": 2, "val_batch_size": 2},
    "train": {"eval_every": 0, "log_every": 1, "threads": 1},
}
"""The tests' tiny shallow-water run (tests/helpers.py: TINY_RUN) without its step count."""


def write_config(folder: Path, steps: int, checkpoint_every: int) -> Path:
    """The tiny run for ``steps`` steps, its data cache in ``folder/cache`` (shared by every try)."""
    data = json.loads(json.dumps(TINY_RUN))
    data["data"]["cache_dir"] = str(folder / "cache")
    data["train"].update(max_steps=steps, checkpoint_every=checkpoint_every)
    path = folder / "tiny.json"  # JSON is YAML: load_config reads it
    path.write_text(json.dumps(data, indent=2))
    return path


def child_env(folder: Path) -> dict[str, str]:
    """One thread, this checkout's eqvit first on the path, every eqvit cache inside ``folder``."""
    path = os.pathsep.join(p for p in (str(PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "EQVIT_CACHE": str(folder / "cache")}


def train_command(config: Path, out: Path, resume: bool = False) -> list[str]:
    return [sys.executable, "-m", "eqvit", "train", str(config), "--out", str(out), *(["--resume"] if resume else [])]


def _as_from_a_terminal() -> None:
    """In the child: SIGINT and SIGTERM at their defaults (a background job inherits SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Child:
    """``eqvit train`` as a subprocess whose output (stdout and stderr) is read as it comes, noting when the
    progress bar (``k/STEPS``) first appears."""

    def __init__(self, cmd: list[str], env: dict[str, str], steps: int, cwd: Path) -> None:
        self._bar_pattern = re.compile(rb"\b\d+/%d\b" % steps)
        self._last_pattern = re.compile(rb"\b%d/%d\b" % (steps, steps))
        self.output = bytearray()
        self.bar_at: float | None = None  # seconds after the start when the bar appeared
        self.last_step_at: float | None = None  # ... and when it first showed the last step
        self.bar = threading.Event()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_as_from_a_terminal,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 65536):
            now = time.monotonic() - self.started
            self.output += chunk
            tail = bytes(self.output[-4096:])
            if self.bar_at is None and self._bar_pattern.search(tail):
                self.bar_at = now
                self.bar.set()
            if self.last_step_at is None and self._last_pattern.search(tail):
                self.last_step_at = now
        self.bar.set()  # the output ended (the process exited) without a bar: stop waiting for one

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        self.proc.stdout.close()
        return code

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace").replace("\r", "\n")

    def tail(self, lines: int = 8) -> str:
        kept = [line for line in self.text.splitlines() if line.strip() and "step/s" not in line]
        return "\n".join(kept[-lines:])


def run_stopped(
    cmd: list[str],
    env: dict[str, str],
    steps: int,
    signame: str,
    moment: dict[str, Any],
    out: Path,
    timeout: float,
    cwd: Path,
) -> dict:
    """Run ``cmd``, send ``signame`` at ``moment``, wait for its exit.

    ``moment`` is ``{"delay": s, "bar_at": s}``: ``delay`` seconds after the run's progress bar appeared (a
    negative delay: ``bar_at + delay`` seconds after the start, ``bar_at`` being when the reference's bar
    appeared, or at the bar if that comes first); or ``{"write": NAME, "number": k, "then": s}``: ``then``
    seconds after the k-th temporary of ``out/NAME`` (an atomic write in progress) is first seen.
    """
    child = Child(cmd, env, steps, cwd)
    sent_at = seen_write = None
    if "write" in moment:
        seen_write = _wait_for_write(child, out, moment["write"], moment["number"], timeout)
        if seen_write is not None:
            time.sleep(moment["then"])
    elif moment["delay"] < 0:
        child.bar.wait(max(0.0, moment["bar_at"] + moment["delay"]))
    else:
        child.bar.wait(timeout)
        time.sleep(moment["delay"])
    if child.proc.poll() is None:  # (a finished, unreaped child could still take the signal harmlessly)
        child.proc.send_signal(getattr(signal, signame))
        sent_at = time.monotonic() - child.started
    code = child.wait(timeout)
    after_bar = None if sent_at is None or child.bar_at is None else sent_at - child.bar_at
    return dict(
        exit_code=code,
        signal_at_s=_round(sent_at),
        after_bar_s=_round(after_bar),
        bar_at_s=_round(child.bar_at),
        write_seen=seen_write is not None if "write" in moment else None,
        tail=child.tail(),
    )


def _wait_for_write(child: Child, out: Path, name: str, number: int, timeout: float) -> float | None:
    """Poll ``out`` (every 0.5 ms) until the ``number``-th temporary ``.NAME.XXXXXXXX.tmp`` appears; when, or None if
    the process ended first."""
    prefix, seen = f".{name}.", set()
    deadline = time.monotonic() + timeout
    while child.proc.poll() is None and time.monotonic() < deadline:
        try:
            names = os.listdir(out)
        except OSError:
            names = []
        seen.update(n for n in names if n.startswith(prefix) and n.endswith(".tmp"))
        if len(seen) >= number:
            return time.monotonic() - child.started
        time.sleep(0.0005)
    return None


def run_to_end(cmd: list[str], env: dict[str, str], steps: int, timeout: float, cwd: Path) -> dict:
    child = Child(cmd, env, steps, cwd)
    code = child.wait(timeout)
    return dict(
        exit_code=code,
        wall_s=_round(time.monotonic() - child.started),
        bar_at_s=_round(child.bar_at),
        last_step_at_s=_round(child.last_step_at),
        fresh_start="starting from scratch" in child.text,
        tail=child.tail(),
    )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# ------------------------------------------------------------------------------------------------
# what a run left, and the comparison


def checkpoint_step(out: Path) -> int | None:
    """The step of ``out/last.safetensors``, ``None`` if there is none; -1 if it does not load."""
    from eqvit.train.checkpoint import load_checkpoint

    if not (out / "last.safetensors").exists():
        return None
    try:
        return int(load_checkpoint(out / "last.safetensors")[1]["step"])
    except Exception:  # a corrupt checkpoint is a finding of the campaign, not its crash
        return -1


def temporaries(out: Path) -> list[str]:
    """Files a write cut short left in ``out`` (eqvit.utils.atomic_write's ``.NAME.XXXXXXXX.tmp``)."""
    return sorted(p.name for p in out.glob("*.tmp")) if out.is_dir() else []


def losses(out: Path) -> list[tuple[int, float]]:
    with open(out / "history.csv") as fh:
        return [(int(row["step"]), float(row["loss"])) for row in csv.DictReader(fh)]


def weights(out: Path) -> dict:
    from eqvit.train.checkpoint import load_checkpoint

    tensors, _ = load_checkpoint(out / "last.safetensors")
    return {k: v for k, v in tensors.items() if k.startswith(("model.", "optim."))}


def differences(reference: Path, out: Path) -> list[str]:
    """What differs between two finished runs: their losses (history.csv) and their model and optimiser tensors
    (last.safetensors), bit for bit. Empty: the runs are the same."""
    import torch

    found = []
    try:
        ref_losses, got_losses = losses(reference), losses(out)
    except (OSError, KeyError, ValueError) as err:
        found.append(f"history.csv unreadable: {err}")
    else:
        if ref_losses != got_losses:
            diff = [(a, b) for a, b in zip(ref_losses, got_losses, strict=False) if a != b]
            first = f", first {diff[0][1]} instead of {diff[0][0]}" if diff else ""
            found.append(
                f"losses differ ({len(got_losses)} rows against {len(ref_losses)}, {len(diff)} unequal{first})"
            )
    try:
        ref_weights, got_weights = weights(reference), weights(out)
    except Exception as err:
        found.append(f"last.safetensors unreadable: {err}")
    else:
        if ref_weights.keys() != got_weights.keys():
            found.append(f"tensor names differ: {sorted(set(ref_weights) ^ set(got_weights))[:3]}")
        differ = [
            k
            for k in sorted(ref_weights.keys() & got_weights.keys())
            if ref_weights[k].shape != got_weights[k].shape or not torch.equal(ref_weights[k], got_weights[k])
        ]
        if differ:
            found.append(f"{len(differ)} of {len(ref_weights)} tensors differ, e.g. {differ[:3]}")
    return found


# ------------------------------------------------------------------------------------------------
# the campaign


def draw_moment(index: int, rng: random.Random, timeline: dict[str, float]) -> dict[str, Any]:
    """When try ``index`` stops its run. A third of each signal's tries aim at a checkpoint write: the k-th
    periodic write of ``last.safetensors`` or of its sidecar ``last.json`` (the checkpoint's two renames), 0 to
    4 ms after its temporary appeared (a SIGKILL then lands inside the write). The others draw a delay after the
    progress bar, uniform in ``[-lead, window]``: from shortly before the bar (the model and data are ready, the
    output folder made) through the steps and the final checkpoint into the final evaluation."""
    delay = rng.uniform(-timeline["lead"], timeline["window"])
    name, number, then = (
        rng.choice(("last.safetensors", "last.json")),
        rng.randint(1, timeline["writes"]),
        rng.uniform(0, 0.004),
    )
    if (index // len(SIGNALS)) % 3 == 2:
        return {"write": name, "number": number, "then": round(then, 4)}
    return {"delay": round(delay, 3), "bar_at": timeline["bar_at"]}


def one_try(
    index: int,
    signame: str,
    rng: random.Random,
    config: Path,
    reference: Path,
    timeline: dict[str, float],
    work: Path,
    env: dict[str, str],
    steps: int,
    resume_kill_rate: float,
    max_resumes: int,
    timeout: float,
) -> dict[str, Any]:
    """Stop a run with ``signame`` at a random moment (:func:`draw_moment`), resume it until it completes (the first
    resume stopped too, at a random delay, with probability ``resume_kill_rate``), compare it with ``reference``."""
    out = work / f"try{index:03d}"
    moment = draw_moment(index, rng, timeline)
    resume_kill = rng.random() < resume_kill_rate
    resume_signal = rng.choice(SIGNALS)
    resume_moment = {
        "delay": round(rng.uniform(-timeline["lead"], timeline["window"]), 3),
        "bar_at": timeline["bar_at"],
    }
    stopped = run_stopped(train_command(config, out), env, steps, signame, moment, out, timeout, work)
    aimed = "write" in moment
    row: dict[str, Any] = dict(
        index=index,
        signal=signame,
        moment=f"write {moment['number']} of {moment['write']}" if aimed else "random",
        delay_s=stopped["after_bar_s"] if aimed else moment["delay"],
        signal_after_bar_s=stopped["after_bar_s"],
        signal_at_s=stopped["signal_at_s"],
        exit_code=stopped["exit_code"],
        checkpoint_before_resume=(out / "last.safetensors").exists(),
        checkpoint_step=checkpoint_step(out),
        temporaries_left=temporaries(out),
        resumes=0,
        resume_exit_codes=[],
        resume_stop=None,
        fresh_start=False,
    )
    if aimed:
        row["write_seen"] = stopped["write_seen"]
    if stopped["exit_code"] not in (0, -signal.SIGKILL, 130, 143):
        row["stop_output"] = stopped["tail"]
    last = stopped
    if stopped["exit_code"] != 0:
        for attempt in range(max_resumes):
            cmd = train_command(config, out, resume=True)
            if attempt == 0 and resume_kill:
                last = run_stopped(cmd, env, steps, resume_signal, resume_moment, out, timeout, work)
                row["resume_stop"] = dict(
                    signal=resume_signal,
                    delay_s=resume_moment["delay"],
                    exit_code=last["exit_code"],
                    checkpoint_step=checkpoint_step(out),
                )
            else:
                last = run_to_end(cmd, env, steps, timeout, work)
                row["fresh_start"] |= last["fresh_start"]
            row["resumes"] += 1
            row["resume_exit_codes"].append(last["exit_code"])
            if last["exit_code"] == 0:
                break
    row["completed"] = last["exit_code"] == 0
    found = differences(reference, out) if row["completed"] else ["the run did not complete"]
    if not row["completed"]:
        row["last_output"] = last["tail"]
    row["exact"] = not found
    row["differences"] = found
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Tries and exact tries, overall and per signal, with the exit codes each signal gave; and where the stops
    landed: before any checkpoint, inside a checkpoint write (a temporary left), after the run had finished, and
    how many first resumes were stopped too."""
    by_signal = {}
    for name in SIGNALS:
        mine = [r for r in rows if r["signal"] == name]
        codes: dict[str, int] = {}
        for r in mine:
            codes[str(r["exit_code"])] = codes.get(str(r["exit_code"]), 0) + 1
        by_signal[name] = dict(
            tries=len(mine),
            exact=sum(bool(r["exact"]) for r in mine),
            exit_codes=dict(sorted(codes.items())),
            checkpoint_before_resume=sum(bool(r["checkpoint_before_resume"]) for r in mine),
        )
    stops = dict(
        before_any_checkpoint=sum(not r["checkpoint_before_resume"] for r in rows),
        inside_a_checkpoint_write=sum(bool(r.get("temporaries_left")) for r in rows),
        after_the_run_finished=sum(r["exit_code"] == 0 for r in rows),
        resume_stopped_too=sum(bool(r.get("resume_stop")) for r in rows),
    )
    return dict(tries=len(rows), exact=sum(bool(r["exact"]) for r in rows), by_signal=by_signal, stops=stops)


def campaign(
    tries: int,
    seed: int = 0,
    steps: int = 16,
    checkpoint_every: int = 2,
    resume_kill_rate: float = 0.3,
    max_resumes: int = 3,
    timeout: float = 300.0,
    work: Path | None = None,
    echo=None,
) -> dict[str, Any]:
    """The whole campaign (see the module docstring); ``work`` (default: a temporary folder, removed after);
    ``echo`` prints each line of the table as it comes (default: ``print``, flushed)."""
    import torch

    echo = echo or (lambda line: print(line, flush=True))

    loadavg_start = [round(v, 2) for v in os.getloadavg()]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eqvit-kill-resume-") as tmp:
        work = Path(work) if work is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        config = write_config(work, steps, checkpoint_every)
        env = child_env(work)
        reference = work / "reference"
        ref = run_to_end(train_command(config, reference), env, steps, timeout, work)  # also builds the data cache
        if ref["exit_code"] != 0 or ref["bar_at_s"] is None or ref["last_step_at_s"] is None:
            raise RuntimeError(f"the reference run failed (exit {ref['exit_code']}):\n{ref['tail']}")
        span = ref["last_step_at_s"] - ref["bar_at_s"]
        timeline = dict(
            bar_at=ref["bar_at_s"],
            lead=0.5,
            window=round(span + 0.5, 3),  # the steps, the final checkpoint, into the final evaluation
            writes=max(1, steps // checkpoint_every) if checkpoint_every else 1,
        )
        echo(
            f"reference: {steps} steps, a checkpoint every {checkpoint_every}: {ref['wall_s']:.1f} s, its bar at "
            f"{ref['bar_at_s']:.1f} s, the last step {span:.2f} s later; random delays in "
            f"[-{timeline['lead']}, {timeline['window']}] s after the bar"
        )
        rng = random.Random(seed)
        rows = []
        echo(HEADER)
        for index in range(tries):
            signame = SIGNALS[index % len(SIGNALS)]
            row = one_try(
                index,
                signame,
                rng,
                config,
                reference,
                timeline,
                work,
                env,
                steps,
                resume_kill_rate,
                max_resumes,
                timeout,
            )
            rows.append(row)
            echo(format_row(row))
    return dict(
        **summarise(rows),
        settings=dict(
            seed=seed,
            steps=steps,
            checkpoint_every=checkpoint_every,
            resume_kill_rate=resume_kill_rate,
            max_resumes=max_resumes,
            model=TINY_RUN["model"],
            data=TINY_RUN["data"],
            threads=1,
            delays_after_bar_s=[-timeline["lead"], timeline["window"]],
        ),
        reference={k: v for k, v in ref.items() if k != "tail"},
        rows=rows,
        wall_s=round(time.monotonic() - started, 1),
        loadavg_start=loadavg_start,
        loadavg_end=[round(v, 2) for v in os.getloadavg()],
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        machine=dict(
            platform=platform.platform(),
            processor=platform.processor() or platform.machine(),
            cpu_count=os.cpu_count(),
            python=platform.python_version(),
            torch=torch.__version__,
        ),
    )


HEADER = (
    f"{'try':>4} {'signal':<8} {'moment':<28} {'delay s':>7} {'exit':>5} {'ckpt':>5} {'tmp':>4} {'resumes':>7}  exact"
)


def format_row(row: dict[str, Any]) -> str:
    """One line of the table: the try, its signal and moment, what it left, how it resumed, whether it is exact."""
    at = "-" if row["delay_s"] is None else f"{row['delay_s']:.3f}"
    step = "-" if row["checkpoint_step"] is None else str(row["checkpoint_step"])
    again = (
        f" (resume stopped by {row['resume_stop']['signal']}: {row['resume_stop']['exit_code']})"
        if row["resume_stop"]
        else ""
    )
    fresh = " (resumed from scratch)" if row["fresh_start"] else ""
    verdict = "yes" if row["exact"] else "NO: " + "; ".join(row["differences"])
    return (
        f"{row['index']:>4} {row['signal']:<8} {row['moment']:<28} {at:>7} {row['exit_code']:>5} {step:>5} "
        f"{len(row['temporaries_left']):>4} {row['resumes']:>7}  {verdict}{again}{fresh}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0, help="seed of the delays and of the resume stops")
    parser.add_argument("--steps", type=int, default=16, help="steps of the tiny run")
    parser.add_argument("--checkpoint-every", type=int, default=2, help="periodic checkpoints (0: only at the end)")
    parser.add_argument(
        "--resume-kill-rate", type=float, default=0.3, help="share of tries whose first resume is stopped too"
    )
    parser.add_argument("--max-resumes", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one eqvit train may take")
    parser.add_argument("--work", help="keep the runs in this folder (default: a temporary one)")
    parser.add_argument("--out", default=str(results_dir() / "kill_resume.json"))
    args = parser.parse_args(argv)
    if args.tries < 1 or args.steps < 1 or args.checkpoint_every < 0 or not 0 <= args.resume_kill_rate <= 1:
        parser.error(
            "--tries and --steps must be at least 1, --checkpoint-every at least 0, --resume-kill-rate in [0, 1]"
        )
    result = campaign(
        args.tries,
        seed=args.seed,
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        resume_kill_rate=args.resume_kill_rate,
        max_resumes=args.max_resumes,
        timeout=args.timeout,
        work=Path(args.work) if args.work else None,
    )
    print(f"\n{'signal':<8} {'tries':>5} {'exact':>5}  exit codes")
    for name, s in result["by_signal"].items():
        codes = ", ".join(f"{code}: {count}" for code, count in s["exit_codes"].items())
        print(f"{name:<8} {s['tries']:>5} {s['exact']:>5}  {codes}")
    st = result["stops"]
    print(
        f"stops before any checkpoint {st['before_any_checkpoint']}, inside a checkpoint write (a temporary left) "
        f"{st['inside_a_checkpoint_write']}, after the run finished {st['after_the_run_finished']}; "
        f"first resume stopped too {st['resume_stopped_too']}"
    )
    print(
        f"{result['exact']} of {result['tries']} tries exact; load {result['loadavg_start'][0]:.1f} -> "
        f"{result['loadavg_end'][0]:.1f} on {result['machine']['cpu_count']} CPUs, {result['wall_s']:.0f} s"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if result["exact"] == result["tries"] else 1


if __name__ == "__main__":
    sys.exit(main())
