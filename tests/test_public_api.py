import subprocess
import sys

import meshplan


def test_all_names_exist():
    for name in meshplan.__all__:
        assert hasattr(meshplan, name), name


def test_core_never_imports_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import meshplan, meshplan.cli, meshplan.explain, meshplan.report.text, meshplan.report.json\n"
            "from meshplan.cli import main\n"
            "assert main(['evaluate', '--plan', 'dp_shard=64', '--json']) == 0\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_reference_key_is_registered():
    import pathlib
    import re

    from meshplan.references import REFERENCES

    src = pathlib.Path(meshplan.__file__).parent
    used = set()
    for f in src.rglob("*.py"):
        pattern = r"\[(\w+20\d\d\w*|nccl_tests_perf|fsdp2_api|megatron_\w+|ml_engineering|worked_example)\]"
        used |= set(re.findall(pattern, f.read_text()))
    assert used <= set(REFERENCES), used - set(REFERENCES)
