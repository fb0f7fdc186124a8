"""nbval runs each chapter in a kernel that inherits this process's environment: give it the one the
stored outputs were made under by .ci/execute_notebooks.py. One thread, because torch's CPU results (a
trained model's loss) can differ in the last digits between one and two threads; it also keeps
`pytest -n 2` from oversubscribing two cores."""

import os
import tempfile

os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile's on-disk cache, fresh for each test run (tests/conftest.py says why);
# unset or empty (empty would put the cache in the working directory)
if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="posenc-inductor-")
