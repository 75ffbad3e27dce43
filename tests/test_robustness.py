"""Nothing lost, nothing absurd: a regression corpus of hostile inputs, full disks, killed and interrupted
runs. Each hostile input gets one line naming the field, the right exit status and no traceback; a write
that fails leaves the old file as it was; a killed run leaves no worker behind."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshplan.cli import main

MESHPLAN = [sys.executable, "-m", "meshplan.cli"]
BIG = "9" * 5000


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    """The error line, after checking the stream holds that line alone and no traceback."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


# (arguments, files {name: content}, what the line says) — each from an attack on the command line, a spec
# file or a profile that raised, hung or printed an absurd figure
CORPUS = [
    (["sweep", "--vary", "batch-tokens=1e-300..1e300", "--points", "3"], {}, "batch-tokens takes values from"),
    (["sweep", "--vary", "inter-node-bandwidth=1e-9..1e9"], {}, "inter-node-bandwidth takes values from"),
    (["evaluate", "--plan", "dp_shard=-1", "--model", "{bigint}"], {"bigint.toml": f'name = "x"\nn_layers = {BIG}\n'},
     "a number of thousands of digits"),
    (["evaluate", "--plan", "dp_shard=-1", "--profile", "{bigprof}"],
     {"bigprof.json": '{"schema": "meshplan.profile/1", "gemm_best_flop_per_s": ' + BIG + "}"},
     "malformed JSON"),
    (["evaluate", "--plan", "dp_shard=-1", "--cluster", "{tiny_eff}"],
     {"tiny_eff.toml": 'accelerator = "h100-sxm"\n[node]\nnic_efficiency = 5e-324\n'},
     "cluster.node.nic_efficiency: must be a number in [1e-06, 1]"),
    (["evaluate", "--plan", "dp_shard=-1", "--cluster", "{fast_nic}"],
     {"fast_nic.toml": 'accelerator = "h100-sxm"\nnodes = 8\n[node]\nnic_gb_per_s = 1e290\n'},
     "cluster.node.nic_gb_per_s: must be a number from 0.001 to 100000"),
    (["evaluate", "--plan", "dp_shard=-1", "--cluster", "{slow_gemm}"],
     {"slow_gemm.toml": 'name = "x"\nbf16_dense_tflop_per_s = 989\nhbm_capacity_gib = 80\n'
                        'hbm_bandwidth_tb_per_s = 3.35\ngemm_efficiency = 1e-300\n'
                        '[node]\ngpus_per_node = 8\nintra_kind = "nvswitch"\nintra_link_gb_per_s = 450\n'
                        'ring_busbw_gb_per_s = 360\nnic_gb_per_s = 50\n'
                        '[sources]\nbf16_dense_tflop_per_s = "s"\nhbm_capacity_gib = "s"\n'
                        'hbm_bandwidth_tb_per_s = "s"\ngemm_efficiency = "s"\ngpus_per_node = "s"\n'
                        'intra_link_gb_per_s = "s"\nring_busbw_gb_per_s = "s"\nnic_gb_per_s = "s"\n'},
     "accelerator.gemm_efficiency: must be a number in [1e-06, 1]"),
    (["evaluate", "--model", "mixtral-8x7b", "--nodes", "4", "--plan", "ep=8,dp_shard=32", "--job", "{capacity}"],
     {"capacity.toml": "global_batch_tokens = 4194304\nseq_len = 4096\nmoe_capacity_factor = 0.25\n"},
     "job.moe_capacity_factor: must be a number from 1 to 1000"),
    (["evaluate", "--plan", "dp_shard=64", "--profile", "{neg_alpha}"],
     {"neg_alpha.json": '{"schema": "meshplan.profile/1", "collective_fits": {"all_gather@inter_node": '
                        '{"alpha_s": -1e-5, "busbw_bytes_per_s": 2e10}}}'},
     "alpha_s must be from 0 to 1 s"),
    (["evaluate", "--plan", "dp_shard=64", "--nodes", "\u0668"], {}, "argument --nodes"),
    (["evaluate", "--plan", "dp_shard=6\u0664"], {}, "plan.dp_shard: must be an integer"),
    (["evaluate", "--plan", "dp_shard=64", "--inter-node-bandwidth", "\u0665\u0660"], {},
     "argument --inter-node-bandwidth"),
    (["evaluate", "--plan", "dp_shard=64", "--batch-tokens", "\u0664M"], {}, "argument --batch-tokens"),
    (["evaluate", "--plan", "dp_shard=-1", "--model", "{dotted}"],
     {"dotted.toml": "a" + ".a" * 100_000 + " = 1\n"}, "a dotted key of more than 16 parts"),
    (["evaluate", "--plan", "dp_shard=-1", "--model", "{huge}"], {"huge.toml": "k = 1\n" * 300_000},
     "at most 1,048,576 are read"),
    (["evaluate", "--plan", "dp_shard=-1", "--model", "{unknown}"],
     {"unknown.toml": "".join(f"key{i} = {i}\n" for i in range(50_000))}, "and 49,"),
    (["measure", "compare", "--profile", "{gemm}"],
     {"gemm.json": '{"schema": "meshplan.profile/1", "created": "x", "device": "cpu", "backend": "gloo", '
                   '"world_size": 1, "nproc_per_node": 1, "collectives": [], "collective_fits": {}, '
                   '"gemm": [{"m": 1' + "0" * 400 + ', "n": 8, "k": 8, "dtype": "bf16", "median_s": 1.0, '
                   '"p10_s": 1.0, "p90_s": 1.0, "flop_per_s": 1.0}], "notes": []}'},
     "m, n, k must be whole numbers from 1 to"),
]


@pytest.mark.parametrize("args, files, says", CORPUS, ids=[c[2][:40] for c in CORPUS])
def test_hostile_input_gets_one_line_naming_the_field(capsys, tmp_path, args, files, says):
    if args[0] == "measure":
        pytest.importorskip("torch")
    for name, content in files.items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    paths = {name.split(".")[0]: str(tmp_path / name) for name in files}
    start = time.perf_counter()
    code, _, err = run(capsys, *(a.format(**paths) for a in args))
    line = one_line_error(err)
    assert code == 2 and says in line, line
    assert len(line) < 1000
    assert time.perf_counter() - start < 20  # the 200 KB dotted key took minutes and gigabytes


# -- the library is as strict as the command line -------------------------------------------------------


def test_library_constructors_refuse_wrong_types_and_absurd_values():
    from meshplan import ClusterSpec, JobSpec, Plan, SpecError, load_cluster
    from meshplan.search.space import Space
    from meshplan.specs import InterNodeLink

    c = load_cluster("h100-sxm", nodes=1)
    cases = [
        (lambda: Plan(async_tp="no", tp=2), "plan.async_tp: must be true or false"),
        (lambda: Plan(sp="yes", tp=2), "plan.sp"),
        (lambda: Plan(layout=5), "plan.layout: must be a string"),
        (lambda: Plan(vpp=10**9), "plan.vpp"),
        (lambda: Plan(tp="2"), "plan.tp"),
        (lambda: ClusterSpec(name="x", accelerator=None, n_nodes=1, gpus_per_node=8, intra=c.intra,
                             inter=c.inter), "cluster.accelerator: must be an AcceleratorSpec"),
        (lambda: ClusterSpec(name="x", accelerator=c.accelerator, n_nodes=1, gpus_per_node=8, intra=c.intra,
                             inter="fast"), "cluster.inter"),
        (lambda: InterNodeLink(nic_bytes_per_s=50e9, latency_s=-1e-6), "cluster.inter.latency_s"),
        (lambda: InterNodeLink(nic_bytes_per_s=50e9, efficiency=float("nan")), "cluster.inter.efficiency"),
        (lambda: InterNodeLink(nic_bytes_per_s=1e290), "cluster.inter.nic_bytes_per_s"),
        (lambda: JobSpec(global_batch_tokens=4096, seq_len=4096, optimizer=5), "job.optimizer"),
        (lambda: JobSpec(global_batch_tokens=4096, seq_len=4096, runtime=None), "job.runtime"),
        (lambda: JobSpec(global_batch_tokens=4096, seq_len=4096, moe_capacity_factor=0.25),
         "job.moe_capacity_factor"),
        (lambda: Space(max_vpp=10**9), "space.max_vpp"),
        (lambda: Space(shardings=("zero9",)), "space.shardings"),
        (lambda: Space(pipeline="no"), "space.pipeline"),
    ]
    for make, says in cases:
        with pytest.raises(SpecError, match=f"^{says.replace('[', '.').replace(']', '.')}"):
            make()


def test_library_entry_points_refuse_wrong_arguments_with_meshplans_own_error():
    """evaluate(mfu=0) divided by zero, mfu=5 and nan were accepted, a string model raised AttributeError."""
    from meshplan import (
        JobSpec,
        SpecError,
        analyse,
        evaluate,
        evaluate_simplified,
        load_cluster,
        load_model,
        param_counts,
        parse_plan,
        search,
    )
    from meshplan.search.space import Space
    from meshplan.search.sweep import sweep

    m, c = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    j, p = JobSpec(global_batch_tokens=1 << 20, seq_len=8192), parse_plan("dp_shard=8")
    calls = {
        "evaluate.mfu": lambda: evaluate(m, c, j, p, mfu=0),
        "evaluate.mfu ": lambda: evaluate(m, c, j, p, mfu=5),
        "evaluate.mfu  ": lambda: evaluate(m, c, j, p, mfu=float("nan")),
        "evaluate.model": lambda: evaluate("llama-3-8b", c, j, p),
        "evaluate.cluster": lambda: evaluate(m, None, j, p),
        "evaluate.job": lambda: evaluate(m, c, {}, p),
        "evaluate.plan": lambda: evaluate(m, c, j, "dp_shard=8"),
        "evaluate_simplified.mfu": lambda: evaluate_simplified(m, c, j, p, mfu=None),
        "search.space": lambda: search(m, c, j, space="full"),
        "search.workers": lambda: search(m, c, j, workers=0),
        "search.mfu": lambda: search(m, c, j, mfu=-1),
        "space.max_vpp": lambda: search(m, c, j, Space(max_vpp=10**9)),
        "analyse.job": lambda: analyse(m, c, None),
        "sweep.values": lambda: sweep(m, c, j, "gpus", [float("inf")]),
        "sweep.vary": lambda: sweep(m, c, j, "gpus", [1e300]),
        "plan": lambda: parse_plan(5),
        "model": lambda: load_model(5),
        "param_counts.model": lambda: param_counts("x"),
    }
    for field, call in calls.items():
        with pytest.raises(SpecError) as exc:
            call()
        assert exc.value.field == field.strip(), (field, exc.value)


def test_a_bad_write_names_the_path_and_leaves_the_old_file(tmp_path):
    from meshplan.fileio import WriteError, atomic_write_text

    target = tmp_path / "keep.json"
    target.write_text("OLD")
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):  # root ignores the mode
            pytest.skip("this user can write to a read-only folder")
        with pytest.raises(WriteError, match=r"keep\.json: cannot write"):
            atomic_write_text(target, "NEW")
    finally:
        os.chmod(tmp_path, 0o700)
    assert target.read_text() == "OLD"


# -- full disks: every writing command, with the file-size limit below what it writes ---------------------

def _limited(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


def _cli(args: list[str], cwd: Path, *, limit_bytes: int | None = None, timeout: float = 600
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MESHPLAN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_limited(limit_bytes) if limit_bytes else None)


def _published_rows(n: int) -> str | None:
    data = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "published_runs.csv"
    if not data.is_file():
        return None
    lines = data.read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[: n + 1]) + "\n"


WRITERS = [
    ("trace", ["evaluate", "--plan", "dp_shard=64", "--trace", "out.json"], ["out.json"]),
    ("sweep plot", ["sweep", "--model", "llama-3-8b", "--nodes", "1", "--vary", "batch-tokens=256K..1M",
                    "--points", "2", "--seq-len", "8192", "--plot", "out.png"], ["out.png"]),
    ("report", ["report", "--model", "llama-3-8b", "--nodes", "1", "--no-conditions", "--json", "--out", "rep"],
     ["rep/report.html", "rep/report.md", "rep/report.json"]),
    ("validate plot", ["validate", "rows.csv", "--cv", "0", "--plot", "out.png"], ["out.png"]),
    ("calibrate", ["validate", "rows.csv", "--cv", "2", "--calibrate", "cal.toml"], ["cal.toml"]),
    ("measure", ["measure", "collectives", "--nproc", "2", "--backend", "gloo", "--max-bytes", "64K", "--ops",
                 "all_reduce", "--out", "prof.json"], ["prof.json"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, args, outputs", WRITERS, ids=[w[0] for w in WRITERS])
def test_a_full_disk_leaves_the_old_file_intact(tmp_path, name, args, outputs):
    if "rows.csv" in args:
        rows = _published_rows(4)
        if rows is None:
            pytest.skip("needs ../shared/data/published_runs.csv beside the repository")
        (tmp_path / "rows.csv").write_text(rows)
    if "--plot" in args:
        pytest.importorskip("matplotlib")
    if args[0] == "measure":
        pytest.importorskip("torch")
    old = {}
    for out in outputs:
        (tmp_path / out).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / out).write_text("OLD")
        old[out] = "OLD"
    if args[0] == "measure":  # it merges into the profile already there: one made by the same command
        (tmp_path / outputs[0]).unlink()
        assert _cli(args, tmp_path).returncode == 0
        old[outputs[0]] = (tmp_path / outputs[0]).read_text()
    limit = len(old[outputs[0]]) // 2 if args[0] == "measure" else 1500  # below what each command writes
    r = _cli(args, tmp_path, limit_bytes=limit)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("meshplan: error")]
    # progress notes may precede it; measure also names the failing rank on a line of its own
    assert len(errors) == 1 or (args[0] == "measure" and errors[0].startswith("meshplan: error: rank 0:")), r.stderr
    line = errors[-1]
    assert "cannot write (file too large" in line and "unchanged" in line, line
    for out in outputs:
        assert (tmp_path / out).read_text() == old[out]
    leftovers = [p.name for p in tmp_path.rglob(".*.tmp")]
    assert not leftovers, leftovers


def test_calibrate_checks_its_destination_before_the_fit(tmp_path):
    r = _cli(["validate", "rows.csv", "--calibrate", "no/such/folder/cal.toml"], tmp_path, timeout=60)
    assert r.returncode == 2 and "does not exist" in one_line_error(r.stderr)


# -- killed and interrupted runs -------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C at its default, as a terminal's foreground job has it: a process started from a script's
    background job (``cmd &`` without job control, as CI may run these tests) inherits SIGINT ignored, and a
    Python started so never turns Ctrl-C into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_plan_with_workers(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen([*MESHPLAN, "plan", "--jobs", "2"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_a_terminal_starts_it)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        kids = _children(proc.pid)
        if kids:
            return proc, kids
        time.sleep(0.05)
    proc.kill()
    pytest.fail("plan --jobs 2 started no worker")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers are Linux's")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_no_worker_outlives_its_parent(tmp_path, how):
    proc, workers = _start_plan_with_workers(tmp_path)
    if how == "SIGINT":  # Ctrl-C: the terminal signals the whole process group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, getattr(signal, how))
    _, err = proc.communicate(timeout=30)
    time.sleep(1.0)
    assert not [w for w in workers if _alive(w)], f"workers left after {how}"
    if how == "SIGTERM":
        assert proc.returncode == 143 and one_line_error(err) == "meshplan: terminated"
    if how == "SIGINT":
        assert proc.returncode == 130 and one_line_error(err) == "meshplan: interrupted"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers are Linux's")
def test_a_timeout_kill_leaves_no_worker_holding_the_pipe(tmp_path):
    """subprocess.run(timeout=...) kills the parent alone; its workers must not keep stderr open."""
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([*MESHPLAN, "plan", "--jobs", "2"], cwd=tmp_path, capture_output=True, timeout=4)
    assert time.monotonic() - start < 15  # run() waits for the pipes to close after the kill
