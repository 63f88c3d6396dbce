"""A request as publish/endpoints.py Server's handler is given one, for unit
tests of pure routing: the path, and what was sent back."""
from __future__ import annotations


class Request:
    """What the server's handler is given: the path, and what was sent back."""

    def __init__(self, path: str):
        self.path, self.command, self.headers = path, "GET", {}
        self.code, self.body = None, b""
        self.wfile = self

    def send_response(self, code):
        self.code = code

    def send_header(self, *_):
        pass

    def end_headers(self):
        pass

    def write(self, data):
        self.body += data
