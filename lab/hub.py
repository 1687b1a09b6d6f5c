"""A stand-in for the Hugging Face hub on the lab's management bridge, speaking the part of the
hub's HTTP API that `huggingface_hub` uses to fetch a model (model info with file metadata, and
file resolution by HEAD and GET, ranges included). One repository, at one commit, optionally
gated behind a token; the errors the real hub gives (GatedRepo, RevisionNotFound,
RepoNotFound) come with the same status codes and X-Error-Code headers. ``rate`` (bytes a second,
across all downloads) slows it to the pace of a real 155 GiB fetch, so a small model's fetch
runs long enough to show its progress lines.

    with Hub(directory, repo="lab/tiny-llama", token="hf_lab", gated=True) as hub:
        hub.endpoint, hub.commit   # point hf_endpoint and model.revision at these
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

from lab.config import CONTROL_ADDRESS


class Hub:
    def __init__(self, directory: Path, repo: str, token: str | None = None, gated: bool = False, address: str = CONTROL_ADDRESS,
                 rate: int | None = None):
        self.directory, self.repo, self.token, self.gated, self.rate = directory, repo, token, gated, rate
        self.pace = threading.Lock()  # one block at a time when slowed: the rate holds for all downloads together
        self.files = {p.relative_to(directory).as_posix(): p for p in sorted(directory.rglob("*")) if p.is_file()}
        self.sha256 = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in self.files.items()}
        self.commit = hashlib.sha1("".join(f"{n}{h}" for n, h in self.sha256.items()).encode()).hexdigest()
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer((address, 0), self._handler())
        self.endpoint = f"http://{address}:{self.server.server_address[1]}"

    def __enter__(self) -> Hub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def info(self) -> dict:
        siblings = []
        for name, path in self.files.items():
            size = path.stat().st_size
            sibling = {"rfilename": name, "size": size, "blobId": hashlib.sha1(path.read_bytes()).hexdigest()}
            if name.endswith(".safetensors"):
                sibling["lfs"] = {"size": size, "sha256": self.sha256[name], "pointerSize": 134}
            siblings.append(sibling)
        return {"_id": self.commit[:24], "id": self.repo, "modelId": self.repo, "sha": self.commit, "private": False,
                "gated": "auto" if self.gated else False, "disabled": False, "tags": [], "siblings": siblings}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def refuse(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def allowed(self, revision: str) -> bool:
                if hub.gated and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    self.refuse(401, "GatedRepo", f"Access to model {hub.repo} is restricted. You must have access to it.")
                    return False
                if revision not in (hub.commit, "main"):
                    self.refuse(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                    return False
                return True

            def do_GET(self) -> None:
                self.serve(body=True)

            def do_HEAD(self) -> None:
                self.serve(body=False)

            def serve(self, body: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                info_prefix = f"/api/models/{hub.repo}/revision/"
                file_prefix = f"/{hub.repo}/resolve/"
                if path.startswith(info_prefix):
                    if self.allowed(path[len(info_prefix):]):
                        data = json.dumps(hub.info()).encode()
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                elif path.startswith(file_prefix):
                    revision, _, name = path[len(file_prefix):].partition("/")
                    if not self.allowed(revision):
                        return
                    if name not in hub.files:
                        self.refuse(404, "EntryNotFound", f"{name} does not exist at {revision}")
                        return
                    self.send_file(name, body)
                else:
                    self.refuse(404, "RepoNotFound", f"Repository not found: {path}")

            def send_file(self, name: str, body: bool) -> None:
                data = hub.files[name].read_bytes()
                start = 0
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes="):
                    start = int(ranged[6:].split("-")[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", hub.commit)
                self.send_header("ETag", f'"{hub.sha256[name]}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                if hub.rate is None:
                    self.wfile.write(data[start:])
                    return
                block = max(1, hub.rate // 10)
                for offset in range(start, len(data), block):
                    with hub.pace:
                        time.sleep(min(block, len(data) - offset) / hub.rate)
                    self.wfile.write(data[offset:offset + block])

        return Handler
