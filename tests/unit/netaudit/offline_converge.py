"""Run inside `unshare -n` (a network namespace with only loopback): serve a mirror on 127.0.0.1 and run
ansible-playbook with the audit hook on (for ansible-playbook and its children only: this driver's own
server is not audited). Prints one JSON line: rc, output, mirror requests."""

import json
import os
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

mirror_dir, cmd_json, audit_log = sys.argv[1], sys.argv[2], sys.argv[3]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
requests: list[str] = []


class Handler(SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        requests.append(self.path)


server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=mirror_dir))
threading.Thread(target=server.serve_forever, daemon=True).start()
port = server.server_address[1]
cmd = [c.replace("@MIRROR_PORT@", str(port)) for c in json.loads(cmd_json)]
out = subprocess.run(
    cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "LCM_NET_AUDIT": audit_log}
)
server.shutdown()
print(
    json.dumps(
        {
            "rc": out.returncode,
            "out": out.stdout + out.stderr,
            "requests": requests,
            "port": port,
            "routes": Path("/proc/net/route").read_text(),
        }
    )
)
