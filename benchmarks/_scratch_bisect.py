# TEMPORARY (gpu-bisect helper, to be deleted): copied on the device to $D/sitecustomize.py, $D on PYTHONPATH.
# BISECT_PIN=create: cudaHostRegister only in Region.create (not in Region.open, the attach path);
# BISECT_PIN=none: never. BISECT_TRACE=1: print each step of attach/restore to stderr.
import os
import sys

_MODE = os.environ.get("BISECT_PIN", "")
_TRACE = os.environ.get("BISECT_TRACE", "")


def _patch(mod):
    R = mod.Region
    orig_open, orig_create, orig_mapped = R.open.__func__, R.create.__func__, R._mapped.__func__

    def _open(cls, path, size, pin):
        if _TRACE:
            print(f"bisect: Region.open {path} {size} pin={pin} mode={_MODE!r}", file=sys.stderr, flush=True)
        r = orig_open(cls, path, size, pin and _MODE not in ("create", "none"))
        if _TRACE:
            print(f"bisect: Region.open done registered={r.registered}", file=sys.stderr, flush=True)
        return r

    def _create(cls, place, size, pin):
        return orig_create(cls, place, size, pin and _MODE != "none")

    R.open, R.create = classmethod(_open), classmethod(_create)


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "lcm_runner.train.ckpt_shm":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        sys.meta_path.insert(0, self)
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


if _MODE or _TRACE:
    sys.meta_path.insert(0, _Finder())
