"""servelab from a plain `pip install` (no extras, none of the dev dependencies): every
module imports, and `serve`, `load` and `validate` run. A package used at run time but
declared only for development (httpx once was) fails here, not on a user's machine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import free_port, server_process

REPO = Path(__file__).resolve().parents[2]
# The optional extras' packages (pip install 'servelab[spark]'): modules that need them
# import them where they are used, so every module still imports without them.
IMPORT_ALL = """
import importlib, pkgutil, servelab
bad = []
for m in pkgutil.walk_packages(servelab.__path__, "servelab."):
    if m.name.endswith("__main__"):
        continue  # runs the CLI
    try:
        importlib.import_module(m.name)
    except Exception as e:
        bad.append(f"{m.name}: {e!r}")
print("\\n".join(bad))
"""


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with servelab installed as a user installs it; its bin/ folder."""
    root = tmp_path_factory.mktemp("plain-install")
    src = root / "servelab"  # a copy: a build in the tree would leave build/ and egg-info
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: what is imported compiles as it is imported; the rest (plotly's
    # thousands of modules) would take half of the install's 60 s here
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", "--no-compile", str(src)],
                         capture_output=True, text=True, timeout=900, check=False)
    if pip.returncode != 0:
        pytest.skip(f"pip install of servelab failed (no package index?): "
                    f"{pip.stderr.strip().splitlines()[-1:]}")
    return venv / "bin"


def test_every_module_imports_without_the_dev_dependencies(plain: Path) -> None:
    out = subprocess.run([str(plain / "python"), "-c", IMPORT_ALL], capture_output=True,
                         text=True, timeout=300, check=True, cwd=plain)
    assert out.stdout.strip() == ""
    dev = subprocess.run([str(plain / "python"), "-c", "import pytest"], capture_output=True,
                         check=False)
    assert dev.returncode != 0  # the venv really lacks the dev dependencies


def test_serve_load_and_validate_run_from_a_plain_install(plain: Path,
                                                          tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    subprocess.run([str(plain / "python"), "-c",
                    "import sys; from servelab.gateway.demo import VALIDATION_MLP, write_mlp;"
                    " write_mlp(sys.argv[1], **VALIDATION_MLP)", str(model)],
                   check=True, timeout=120, cwd=tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_process([str(plain / "servelab"), "serve", "--model", f"mlp={model}",
                         "--port", str(port)], url + "/v2/health/ready"):
        load = subprocess.run([str(plain / "servelab"), "load", "-m", "mlp", "--url", url,
                               "--qps", "50", "--duration", "1", "--json"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              check=False)
        assert load.returncode == 0, load.stderr[-2000:]
        [step] = json.loads(load.stdout)
        assert step["errors"] == 0
        assert step["ok"] == step["requests"] > 0
        val = subprocess.run([str(plain / "servelab"), "validate", "-m", "mlp", "--url", url,
                              "--rates", "50", "--duration", "1", "--json"],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path,
                             check=False)
        assert val.returncode == 0, val.stderr[-2000:]
        [rate] = json.loads(val.stdout)["rates"]
        assert rate["measured"]["errors"] == 0
