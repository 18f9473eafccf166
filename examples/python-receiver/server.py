"""A partner's receiver of postbox deliveries, in Python's standard library.

    WEBHOOK_SECRET=whsec_... PORT=8080 python3 server.py

It verifies the Standard Webhooks signature itself (verify below). POST
deliveries are signed over their body, GET postbacks over the request
target as sent, query included. The standardwebhooks package of PyPI does
the same for a body: Webhook(secret).verify(body, headers).

Each request gets 204 when its signature verifies and 400 when it does not;
a line on standard output says which ("verified ID" or "rejected"). A
redelivery of an id already seen is acknowledged and not processed twice.
"""

import base64
import hashlib
import hmac
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE = 5 * 60  # seconds either side of now


def verify(secret: str, headers, signed: bytes) -> str:
    """Returns the webhook-id when one of the signatures matches; raises otherwise."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, ts = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(time.time() - int(ts)) > TOLERANCE:
        raise ValueError("timestamp outside the tolerance")
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + signed, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(mac).decode()
    if not any(hmac.compare_digest(expected, s) for s in headers["webhook-signature"].split(" ")):
        raise ValueError("no matching signature")
    return msg_id


SECRET = os.environ["WEBHOOK_SECRET"]
seen = set()  # use a table with a unique key in production


class Handler(BaseHTTPRequestHandler):
    def handle_one(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        # What was signed: the raw body of a POST, the request target of a
        # request without one (a GET postback). self.path is the target as sent.
        signed = self.path.encode() if self.command == "GET" else body
        try:
            msg_id = verify(SECRET, self.headers, signed)
        except (KeyError, ValueError) as err:
            print(f"rejected {self.command} {self.path.split('?')[0]}: {err}", flush=True)
            self.send_response(400)
            self.end_headers()
            return
        if msg_id not in seen:
            seen.add(msg_id)
            # Process the event here: json.loads(body) for a POST, or
            # urllib.parse.urlsplit(self.path).query for a GET postback.
        print(f"verified {msg_id}", flush=True)
        self.send_response(204)
        self.end_headers()

    do_GET = do_POST = do_PUT = do_PATCH = handle_one

    def log_message(self, *args):
        pass  # the lines above say what matters; query strings stay out of logs


server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Handler)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
