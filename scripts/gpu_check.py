"""The mission proof on one Hopper GPU (an H100 or an H200), in at most 7 minutes of command time.

    python3 scripts/gpu_check.py            # on the lent GPU, with the image's python3 (docs/gpu.md)
    python3 scripts/gpu_check.py --dry      # the same steps in Triton's CPU interpreter (make gpu-check-dry)
    python3 scripts/gpu_check.py --plan     # print the GPU run's steps and budgets, run nothing

Steps, in order, each under its own time limit (:data:`GPU_STEPS`, 420 s in all):

    env         the device, driver and versions; the run's folder is named after the device
    wheels      .whl/ installed into a folder put on PYTHONPATH (the image lacks optuna, sqlalchemy)
    imports     everything a search needs imports
    sandbox     the smallest block's baseline checked through the sandboxed worker; if the sandboxed
                worker cannot run on this device, the step is rerun with KERNELFORGE_SANDBOX=off,
                one line says why, and every later step (and so every result) runs that way
    ceilings    measured copy bandwidth and bf16 matmul rate (kernelforge ceilings)
    crosscheck  each proof baseline timed three ways (kernelforge crosscheck)
    search-*    a short search per proof job: baselines and library references first, then the
                job's max_minutes of proposals and confirmation pairs (its clock starts after them)
    tests       the GPU-marked tests, only with what is left of the budget
    pack        nothing to do but the last packing

The run writes reports/<gpu>-<date>/ (the GPU named as it is: h100, h200). Every step, as it ends,
writes its results there and, when OUT is set (the device tool), packs the whole folder into
$OUT/proof.tar.gz (replaced atomically) and copies steps.tsv and the console log: a run killed at
any point has returned everything before that point. Reports and the summary are made afterwards,
on any CPU, from the returned databases: ``python3 scripts/gpu_summary.py reports/<gpu>-<date>``.

--dry runs the same steps in the interpreter on tiny shapes (search/gpu-dry*.toml) into
reports/interpret-dry/ (streamed to reports/interpret-dry-out/ when OUT is unset), ceilings skipped (no hardware to measure), tests only collected, and ends
with the summary, so CI keeps every part of the path alive. Its times are interpreter wall time on
the CPU, never GPU speed. Only the standard library is used here: this runs before the wheels.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"


@dataclass(frozen=True)
class Step:
    """One step of the proof: its name and its time limit in seconds (``budget``)."""

    name: str
    budget: int


GPU_JOBS = ("search/gpu-proof.toml", "search/gpu-proof-moe.toml")
DRY_JOBS = ("search/gpu-dry.toml", "search/gpu-dry-moe.toml")
#: The GPU run: seconds per step, 420 in all (a test holds the sum). The searches' own max_minutes
#: (their job files) end them gracefully before these limits, which only catch a hang.
GPU_STEPS = (Step("env", 10), Step("wheels", 25), Step("imports", 15), Step("sandbox", 25), Step("ceilings", 20),
             Step("crosscheck", 60), Step("search-gpu-proof", 120), Step("search-gpu-proof-moe", 110),
             Step("tests", 30), Step("pack", 5))
#: The dry run: generous, since CI machines are shared (interpreter wall time, not GPU speed).
DRY_STEPS = (Step("env", 60), Step("wheels", 90), Step("imports", 60), Step("sandbox", 120), Step("ceilings", 1),
             Step("crosscheck", 180), Step("search-dry-proof", 300), Step("search-dry-proof-moe", 300),
             Step("tests", 120), Step("pack", 30), Step("summary", 180))
#: What the worker says when it cannot start (kernelforge.execute.worker.process).
WORKER_START_FAILURE = "the evaluation worker could not start"
SANDBOX_OFF = "disabled by KERNELFORGE_SANDBOX=off"


class Run:
    """One run of the proof: its folder, its environment, the steps' records, and the streaming
    of everything to ``$OUT``."""

    def __init__(self, dry: bool, python: str):
        self.dry = dry
        self.python = python
        self.steps = {s.name: s for s in (DRY_STEPS if dry else GPU_STEPS)}
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE), os.environ.get("PYTHONPATH")])),
                    "PYTHONUNBUFFERED": "1"}
        if not dry:
            self.env["KERNELFORGE_TEST_DEVICE"] = "cuda"
        self.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
        if dry and self.out is None:  # the dry run streams too, into a folder of its own
            self.out = ROOT / "reports" / "interpret-dry-out"
            shutil.rmtree(self.out, ignore_errors=True)
            self.out.mkdir(parents=True)
        self.started = time.monotonic()
        self.failed = False
        self.records: list[str] = ["step\tbudget_s\tseconds\tstatus"]
        self.dest: Path | None = None
        self.pending_logs: list[tuple[str, str]] = []

    # -- output ---------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        print(line, flush=True)
        if self.out is not None:
            with open(self.out / "proof.log", "a", encoding="utf-8") as log:
                log.write(line + "\n")

    def set_folder(self, device_slug: str) -> None:
        name = "interpret-dry" if self.dry else f"{device_slug}-{time.strftime('%Y%m%d', time.gmtime())}"
        self.dest = Path(os.environ.get("KF_GPU_CHECK_DEST") or ROOT / "reports" / name)
        for sub in ("logs", "db", "check"):
            shutil.rmtree(self.dest / sub, ignore_errors=True)
            (self.dest / sub).mkdir(parents=True, exist_ok=True)
        for name, text in self.pending_logs:
            (self.dest / "logs" / f"{name}.log").write_text(text, encoding="utf-8")

    def stream(self) -> None:
        """Write the step records, and pack the folder into $OUT (atomically)."""
        if self.dest is None:
            return
        (self.dest / "steps.tsv").write_text("\n".join(self.records) + "\n", encoding="utf-8")
        if self.out is None:
            return
        shutil.copy(self.dest / "steps.tsv", self.out / "steps.tsv")
        partial = self.out / "proof.tar.gz.partial"
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(self.dest, arcname=self.dest.name)
        partial.replace(self.out / "proof.tar.gz")

    # -- steps ----------------------------------------------------------------------------------

    def left(self) -> float:
        """Seconds of the whole plan's budget not yet used."""
        return sum(s.budget for s in self.steps.values()) - (time.monotonic() - self.started)

    def record(self, name: str, budget: float, seconds: float, status: str) -> None:
        self.records.append(f"{name}\t{budget:.0f}\t{seconds:.3f}\t{status}")
        self.say(f"== [{name}] {status} in {seconds:.3f} s")
        self.stream()

    def skip(self, name: str, why: str) -> None:
        self.record(name, 0, 0.0, f"skipped: {why}")

    def run(self, name: str, command: list[str], *, budget: float | None = None, env: dict | None = None,
            log_name: str | None = None) -> tuple[int, str]:
        """Run ``command`` under the step's time limit; its output goes to the console and to
        logs/<name>.log. Returns the exit status (124: timed out) and the output."""
        budget = self.steps[name].budget if budget is None else budget
        self.say(f"== [{name}] (budget {budget:.0f}s): {' '.join(command)}")
        start = time.monotonic()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env or self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=budget)
            rc, output = done.returncode, done.stdout
        except subprocess.TimeoutExpired as exc:
            rc = 124
            output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        except OSError as exc:
            rc, output = 127, f"{command[0]}: {exc}\n"
        seconds = time.monotonic() - start
        for line in output.splitlines():
            self.say(line)
        log = log_name or name
        if self.dest is not None:
            (self.dest / "logs" / f"{log}.log").write_text(output, encoding="utf-8")
        else:
            self.pending_logs.append((log, output))
        status = "ok" if rc == 0 else f"timed out after {budget:.0f}s" if rc == 124 else f"failed (exit {rc})"
        self.failed |= rc != 0
        self.record(log, budget, seconds, status)
        return rc, output

    def kernelforge(self, *args: str) -> list[str]:
        return [self.python, "-m", "kernelforge", *args]


def device_name(run: Run) -> str:
    """The GPU's name from the env step, or ``interpret``."""
    if run.dry:
        return "interpret"
    for line in (run.dest / "device.txt").read_text().splitlines() if run.dest else []:
        if line.startswith("gpu "):
            return line[4:].strip()
    return "unknown GPU"


def env_step(run: Run) -> None:
    probe = ("import sys, torch, triton\n"
             "print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)\n"
             "print('gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')\n")
    if run.dry:
        command = [run.python, "-c", "print('DRY RUN in the Triton interpreter on the CPU: every time is "
                                     "interpreter wall time, not GPU speed')\n" + probe]
    else:
        command = ["bash", "-c", "nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,"
                                 f"power.limit --format=csv; {run.python} -c \"$KF_PROBE\""]
    rc, output = run.run("env", command, env={**run.env, "KF_PROBE": probe})
    name = next((line[4:].strip() for line in output.splitlines() if line.startswith("gpu ")), "unknown GPU")
    sys.path.insert(0, str(SOURCE))
    from kernelforge.devices.hardware import gpu_slug  # noqa: E402 - stdlib-only module of the project

    run.set_folder(gpu_slug(name) if name not in ("none", "unknown GPU") else "gpu")
    (run.dest / "device.txt").write_text(output, encoding="utf-8")
    run.stream()


def wheels_step(run: Run) -> None:
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    if not wheels:
        run.skip("wheels", "no .whl/ was carried (scripts/prepare_wheels.sh fills it): using this Python's packages")
        return
    site = Path(os.environ.get("TMPDIR", "/tmp")) / f"kf-site-{os.getpid()}"
    command = [run.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
               "--upgrade", "--target", str(site)]
    version = subprocess.run([run.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    if version != "3.12":  # the wheels are for the image's 3.12: install them for it, do not import them here
        command += ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
                    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux2014_x86_64"]
    rc, _ = run.run("wheels", command + wheels)
    if rc == 0 and version == "3.12":
        run.env["PYTHONPATH"] += os.pathsep + str(site)


def sandbox_step(run: Run) -> None:
    """The sandboxed worker's first contact with the device; the fallback when it cannot run."""
    device = "interpret" if run.dry else "cuda"
    command = run.kernelforge("check", "norm/fused_add_rmsnorm", "--device", device, "--shapes", "smoke",
                              "--json", str(run.dest / "check" / "sandbox.json"))
    rc, output = run.run("sandbox", command)
    if rc == 0:
        return
    off = {**run.env, "KERNELFORGE_SANDBOX": "off"}
    rc_off, _ = run.run("sandbox", command, env=off, log_name="sandbox-off",
                        budget=max(5.0, run.steps["sandbox"].budget / 2))
    if rc_off == 0:
        why = next((line for line in output.splitlines() if WORKER_START_FAILURE in line or "Error" in line),
                   "see logs/sandbox.log")
        line = (f"the sandboxed worker cannot run on this device ({why.strip()[:300]}): every later step runs with "
                f"KERNELFORGE_SANDBOX=off, and every result records its sandbox as 'none: {SANDBOX_OFF}'")
        run.say(line)
        (run.dest / "sandbox-fallback.txt").write_text(line + "\n", encoding="utf-8")
        run.env = off
        run.stream()


def search_step(run: Run, job: str) -> None:
    name = Path(job).stem
    job_name = {"gpu-dry": "dry-proof", "gpu-dry-moe": "dry-proof-moe"}.get(name, name)
    storage = f"sqlite:///{(run.dest / 'db' / f'{job_name}.db').resolve()}"
    with open(run.dest / "jobs.tsv", "a", encoding="utf-8") as jobs:
        jobs.write(f"{job_name}\t{job}\n")
    command = run.kernelforge("search", job, "--storage", storage, "--progress", "jsonl", "--no-report",
                              *(["--device", "interpret"] if run.dry else []))
    step = f"search-{job_name}"
    start = time.monotonic()
    rc, output = run.run(step, command)
    if rc != 0 and WORKER_START_FAILURE in output and run.env.get("KERNELFORGE_SANDBOX") != "off":
        budget = run.steps[step].budget - (time.monotonic() - start)
        if budget > 10:
            run.say(f"{step}: {WORKER_START_FAILURE} in its sandbox: rerunning with KERNELFORGE_SANDBOX=off")
            run.env = {**run.env, "KERNELFORGE_SANDBOX": "off"}
            run.run(step, command, budget=budget, log_name=f"{step}-sandbox-off")


def tests_step(run: Run) -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                   if "pytest.mark.gpu" in p.read_text(encoding="utf-8", errors="replace"))
    budget = min(run.steps["tests"].budget, run.left() - run.steps["pack"].budget)
    if budget < 10:
        run.skip("tests", f"{budget:.0f} s of the budget left")
        return
    mode = ["--collect-only"] if run.dry else []
    run.run("tests", [run.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *mode, *files],
            budget=budget)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry", action="store_true", help="the same steps in the interpreter on tiny shapes")
    parser.add_argument("--plan", action="store_true", help="print the GPU run's steps and budgets, run nothing")
    args = parser.parse_args(argv)
    dry = args.dry or os.environ.get("KF_GPU_CHECK_DRY") == "1"
    print("the GPU run's plan (seconds per step):")
    for step in GPU_STEPS:
        print(f"  {step.name:24} {step.budget:4d}")
    print(f"  {'total':24} {sum(s.budget for s in GPU_STEPS):4d}")
    if args.plan:
        return 0
    run = Run(dry, os.environ.get("PYTHON") or sys.executable)
    jobs = DRY_JOBS if dry else GPU_JOBS
    env_step(run)
    wheels_step(run)
    run.run("imports", [run.python, "-c", "import optuna, sqlalchemy, jinja2, click, rich, torch, triton, "
                                          "kernelforge.cli.main; print('optuna', optuna.__version__, 'sqlalchemy', "
                                          "sqlalchemy.__version__)"])
    sandbox_step(run)
    if dry:
        run.skip("ceilings", "the interpreter measures no hardware")
    else:
        run.run("ceilings", run.kernelforge("ceilings", "--json", str(run.dest / "ceilings.json")))
    run.run("crosscheck", run.kernelforge("crosscheck", *jobs, "--json", str(run.dest / "crosscheck.json"),
                                          *(["--device", "interpret"] if dry else [])))
    for job in jobs:
        search_step(run, job)
    tests_step(run)
    start = time.monotonic()
    run.stream()
    run.record("pack", run.steps["pack"].budget, time.monotonic() - start, "ok")
    run.records.append(f"total\t{sum(s.budget for s in GPU_STEPS if not dry) or '-'}\t"
                       f"{time.monotonic() - run.started:.3f}\t{'every step passed' if not run.failed else 'SOME STEPS FAILED'}")
    run.stream()
    run.say(f"total {time.monotonic() - run.started:.1f} s; results in {run.dest}"
            + ("; DRY RUN: interpreter wall time on the CPU, not GPU speed" if dry else
               f"; make the reports and summary on a CPU: python3 scripts/gpu_summary.py {run.dest}"))
    if dry:  # what a CPU does with a GPU run's returned folder, done here on the dry run's
        rc, _ = run.run("summary", [run.python, str(ROOT / "scripts" / "gpu_summary.py"), str(run.dest)])
        run.failed |= rc != 0
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
