"""nbval runs each chapter in a kernel that inherits this process's environment: give it the one the
stored outputs were made under by .ci/execute_notebooks.py. One thread, because torch's CPU results (a
trained model's loss) can differ in the last digits between one and two threads; it also keeps
`pytest -n 2` from oversubscribing two cores."""

import os

os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
