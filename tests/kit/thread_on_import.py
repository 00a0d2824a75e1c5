"""Its import starts a thread: a fork server must not fork after preloading it (tests/kit/test_launcher.py)."""
import threading
import time

threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
