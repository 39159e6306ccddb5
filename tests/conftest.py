import os
import sys

# examples/ holds the models the tests train; spawned ranks import them too
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("PYTHONPATH", ROOT)

# Generated Triton kernels run on CPU tensors in Triton's interpreter (tests use tiny
# shapes); set before any kernel module is loaded, and inherited by spawned ranks
os.environ.setdefault("TRITON_INTERPRET", "1")
