"""Which torch build ``./course setup`` installs: the command it would run, not the download.

The PyTorch CPU index cannot be reached from the test machine, so these tests read ``./course torch-command``,
the same function setup calls (``torch_pip_args``), with and without a local CPU wheel and with each choice.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PIN = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text())[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _command(tmp_path: Path, local_wheel: bool, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "COURSE_"))}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ['PATH']}"
    if not local_wheel:  # no pip.conf, no find-links, no local index: nothing but the network would have it
        empty = tmp_path / "no-wheels"
        empty.mkdir(exist_ok=True)
        environ.update({"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(empty)})
    environ.update(env)
    return subprocess.run([str(ROOT / "course"), "torch-command"], capture_output=True, text=True, env=environ,
                          timeout=120)


def _local_cpu_wheel() -> bool:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                           "--no-index", "--quiet", f"torch=={PIN}+cpu"], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU/CUDA choice is Linux's")
def test_cpu_build_from_a_local_wheel_when_pip_finds_one(tmp_path):
    if not _local_cpu_wheel():
        pytest.skip("this machine has no local CPU wheel of torch")
    done = _command(tmp_path, local_wheel=True, COURSE_TORCH="cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pip install torch=={PIN}+cpu", "a local CPU wheel: no index, no download"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU/CUDA choice is Linux's")
def test_cpu_build_from_the_pytorch_cpu_index_without_a_local_wheel(tmp_path):
    done = _command(tmp_path, local_wheel=False, COURSE_TORCH="cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pip install torch=={PIN} --index-url {CPU_INDEX}"


def test_cuda_choice_takes_the_default_build(tmp_path):
    for local_wheel in (True, False):
        done = _command(tmp_path, local_wheel=local_wheel, COURSE_TORCH="cuda")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"pip install torch=={PIN}"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU/CUDA choice is Linux's")
def test_auto_picks_cpu_without_a_gpu_and_cuda_with_one(tmp_path):
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    (tmp_path / "a").mkdir()
    plain = _command(tmp_path / "a", local_wheel=False)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == f"pip install torch=={PIN} --index-url {CPU_INDEX}", "auto is the default"
    fake = tmp_path / "b"
    fake.mkdir()
    (fake / "bin").mkdir()
    smi = fake / "bin" / "nvidia-smi"  # what a machine with an NVIDIA GPU has on its PATH
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    gpu = _command(fake, local_wheel=False, COURSE_TORCH="auto")
    assert gpu.stdout.strip() == f"pip install torch=={PIN}"


def test_an_unknown_choice_is_refused(tmp_path):
    done = _command(tmp_path, local_wheel=True, COURSE_TORCH="rocm")
    assert done.returncode != 0 and "COURSE_TORCH must be auto, cpu or cuda" in done.stderr


def test_setup_installs_what_torch_command_prints():
    text = (ROOT / "course").read_text()
    setup = text[text.index("\nsetup() {"):text.index("\ncmd=")]
    assert 'torch_pip_args "$VENV/bin/python"' in setup and 'pip_quiet install "${torch_args[@]}"' in setup
    assert setup.index("torch_args") < setup.index('install -e ".[student,grader,dev]"'), "torch goes first"


def test_environment_yml_takes_the_cpu_build_from_the_cpu_index():
    lines = [line.strip() for line in (ROOT / "environment.yml").read_text().splitlines()]
    assert f"- --extra-index-url {CPU_INDEX}" in lines
    assert lines.index(f"- --extra-index-url {CPU_INDEX}") < lines.index(f"- torch=={PIN}")
