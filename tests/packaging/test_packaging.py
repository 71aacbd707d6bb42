"""Packaging: what an sdist holds, where a build writes, and that the declared floors are the ones tested.

The README creates ``.venv`` inside the checkout, so an sdist must leave
virtual environments and build output out (``sdist.exclude`` and
``.gitignore``); ``pip install .`` and ``pip wheel .`` must build outside the
source tree (only an editable install keeps ``build/``), so a read-only
checkout installs. These run on the CPU in about a second, with the
scikit-build-core that the ``test`` extra installs.
"""

import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: pytest brings tomli
    import tomli as tomllib

REPO = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# What a user may leave inside the checkout: none of it belongs in an sdist.
LITTER = [".venv/bin/python3", ".venv/lib/python3.11/site-packages/big.py", "venv/pyvenv.cfg",
          ".venv-gpu/pyvenv.cfg", "build/cp311-cp311-linux_x86_64/CMakeCache.txt", "dist/old.tar.gz",
          "jaxgraph.egg-info/PKG-INFO", ".jaxgraph_cache/abc.cubin", "_skbuild/x.o"]


@pytest.fixture(scope="module")
def sdist_names(tmp_path_factory):
    pytest.importorskip("scikit_build_core", reason="scikit-build-core is not installed (the test extra brings it)")
    root = tmp_path_factory.mktemp("checkout") / "jaxgraph"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", ".venv*", "venv*", "*.egg-info", "__pycache__", ".jaxgraph_cache", ".pytest_cache",
        "_skbuild"))
    for name in LITTER:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("litter\n")
    out = tmp_path_factory.mktemp("sdist")
    code = "import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(out / proc.stdout.split()[-1]) as tar:
        return [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]


def test_the_sdist_holds_no_virtual_environment_or_build_output(sdist_names):
    for name in LITTER:
        top = name.split("/")[0]
        assert not any(n == top or n.startswith(top + "/") for n in sdist_names), (top, sdist_names)


def test_the_sdist_holds_the_sources(sdist_names):
    for name in ("pyproject.toml", "CMakeLists.txt", "jaxgraph/__init__.py", "ffi/replay/replay.cc", "ffi/launch/launch.cc",
                 "cmake/cuda_runtime.cmake", "README.md"):
        assert name in sdist_names, name


def test_gitignore_lists_virtual_environments_and_build_dirs():
    lines = (REPO / ".gitignore").read_text().split()
    for pattern in ("/.venv*/", "/venv*/", "build/", "dist/", "*.egg-info/"):
        assert pattern in lines, pattern


def test_only_an_editable_install_keeps_a_build_dir_in_the_checkout():
    """``pip install .``/``pip wheel .`` build in a temporary directory (scikit-build-core's default)."""
    reader = pytest.importorskip("scikit_build_core.settings.skbuild_read_settings",
                                 reason="scikit-build-core is not installed (the test extra brings it)")
    settings = {state: reader.SettingsReader.from_file(REPO / "pyproject.toml", state=state).settings
                for state in ("wheel", "sdist", "editable")}
    assert settings["wheel"].build_dir == "" and settings["sdist"].build_dir == ""
    assert settings["editable"].build_dir == "build/{wheel_tag}"
    assert "build-dir" not in PYPROJECT["tool"]["scikit-build"]


# ---------------------------------------------------------------------------
# The declared floors
# ---------------------------------------------------------------------------


def test_every_runtime_floor_is_an_exact_release_that_floors_sh_can_pin():
    """tests/floors.sh pins each ">=" bound with "==": a bound like "13.0" would pin a release that does not exist."""
    project = PYPROJECT["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["test"]:
        if req.startswith("jaxgraph["):
            continue  # the docs and release extras: tools at their newest, not floors the suite proves
        bound = re.search(r">=\s*([0-9][0-9.]*)", req)
        assert bound, f"{req!r} declares no floor"
        assert bound.group(1).count(".") >= 2, req   # X.Y.Z: "==X.Y.Z" names one release
    assert "jax>=0.6.2" in project["dependencies"] and "jaxlib>=0.6.2" in project["dependencies"]
    assert project["optional-dependencies"]["cuda13"] == ["jax[cuda13]>=0.7.2"]
    script = (REPO / "tests" / "floors.sh").read_text()
    assert "pyproject.toml" in script and '-c "$work/runtime.txt"' in script


# ---------------------------------------------------------------------------
# The package's metadata
# ---------------------------------------------------------------------------


def test_the_sdist_leaves_the_benchmark_results_out(sdist_names):
    """About 4 MB of committed measurements build nothing; the sources of the benchmarks stay."""
    assert (REPO / "benchmarks" / "results").is_dir()
    assert not any(n.startswith("benchmarks/results/") for n in sdist_names), \
        [n for n in sdist_names if n.startswith("benchmarks/results/")][:5]
    assert "benchmarks/run.py" in sdist_names


def test_classifiers_say_what_the_package_declares():
    project = PYPROJECT["project"]
    classifiers = project["classifiers"]
    assert len(set(classifiers)) == len(classifiers)
    for required in ("License :: OSI Approved :: Apache Software License", "Environment :: GPU :: NVIDIA CUDA :: 13",
                     "Topic :: Scientific/Engineering", "Operating System :: POSIX :: Linux",
                     "Programming Language :: C++"):
        assert required in classifiers, required
    assert project["license"] == {"text": "Apache-2.0"} and "Apache License" in (REPO / "LICENSE").read_text()
    # The Python versions listed start at requires-python's floor and are consecutive.
    floor = re.fullmatch(r">=\s*3\.(\d+)", project["requires-python"])
    assert floor, project["requires-python"]
    minors = sorted(int(c.rsplit(".", 1)[1]) for c in classifiers
                    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert minors[0] == int(floor.group(1)) and minors == list(range(minors[0], minors[-1] + 1)), minors
    assert project["authors"] and all(a.get("name") for a in project["authors"])
    assert {"jax", "cuda"} <= set(project["keywords"])


def test_project_urls_are_a_complete_set_under_one_home_when_set():
    """Commented out until the project has a public home (pyproject.toml says why); when set, all four."""
    urls = PYPROJECT["project"].get("urls")
    text = (REPO / "pyproject.toml").read_text()
    if urls is None:
        assert "# [project.urls]" in text and "project.urls" in (REPO / "docs" / "release.md").read_text()
        return
    assert {"Documentation", "Source", "Changelog", "Issues"} <= set(urls), urls
    assert all(u.startswith("https://") and "<" not in u for u in urls.values()), urls
    assert urls["Changelog"].startswith(urls["Source"]) and urls["Issues"].startswith(urls["Source"]), urls
