import os
import sys

# examples/ holds the models the tests train; spawned ranks import them too
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# the tests live in folders by area (strategies/<family>, passes, runtime, planning,
# trace, golden); a module imports the helpers here and, now and then, another area's
# test module by its name, and spawned ranks import them by name too: every folder is
# on the path (pytest's default import mode keys modules by file name, unique here)
TESTS = os.path.dirname(os.path.abspath(__file__))
for _folder, _dirs, _files in sorted(os.walk(TESTS)):
    _dirs[:] = sorted(d for d in _dirs if not d.startswith((".", "__")))
    if _folder not in sys.path and any(f.endswith(".py") for f in _files):
        sys.path.insert(1, _folder)
# processes the tests start (spawned ranks, fresh interpreters) find the same modules
_TEST_PATH = [ROOT] + [p for p in sys.path if p.startswith(TESTS)]
os.environ["PYTHONPATH"] = os.pathsep.join(
    _TEST_PATH + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in _TEST_PATH])

# Generated Triton kernels run on CPU tensors in Triton's interpreter (tests use tiny
# shapes); set before any kernel module is loaded, and inherited by spawned ranks
os.environ.setdefault("TRITON_INTERPRET", "1")

# compile without hardware= prices with this machine's calibrated profile when one is
# cached (autopar.cost.profiles); the tests' plans must not depend on whether the user
# ran `autopar calibrate`, so they see an empty cache of their own (spawned ranks too),
# and compile does not measure the machine on first use (autopar.cost.first_use): the
# tests of that path turn it on themselves
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["AUTOPAR_CACHE_DIR"] = tempfile.mkdtemp(prefix="autopar-test-cache-")
os.environ["AUTOPAR_FIRST_USE_CALIBRATION"] = "0"
atexit.register(shutil.rmtree, os.environ["AUTOPAR_CACHE_DIR"], True)


def pytest_collection_modifyitems(config, items):
    """The tests that read a shared launch's results (tests/shared_ranks.py) run after the
    others, each group in its collected order: the single-process tests then run while the
    worlds work in the background, instead of waiting behind the first test that needs one."""
    import shared_ranks
    items.sort(key=lambda item: bool(item.get_closest_marker("multiprocess") and getattr(item, "module", None)
                                     and shared_ranks.registers_jobs(item.module.__name__)))


def pytest_collection_finish(session):
    """The shared launches (tests/shared_ranks.py) run only the jobs of modules with a
    selected test (a job of ``extended`` tests only when one of those is selected);
    ``--collect-only`` runs none."""
    import shared_ranks
    if session.config.option.collectonly:
        return
    tests = [item for item in session.items if getattr(item, "module", None)]
    extended = {item.module.__name__ for item in tests if item.get_closest_marker("extended")}
    shared_ranks.select_modules({item.module.__name__ for item in tests if not item.get_closest_marker("extended")},
                                extended)
