# A small app for the ingress tests: run inside a sandbox as
#   python3 app.py PORT [ADDRESS]   (ADDRESS 127.0.0.1 unless given)
# GET /hello -> "hello from HOST"; GET /inc -> the number of /inc requests so
# far; GET /big?n=N -> N bytes, streamed in 64 KiB chunks (byte i is i % 251);
# GET /ws with Upgrade -> 101, then echoes every byte until EOF;
# GET /headers -> the request headers; GET /hang -> no answer, ever;
# POST /upload -> the number of body bytes read.
import http.server, socketserver, sys, threading, socket

count = 0
lock = threading.Lock()

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_text(self, s):
        b = s.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        global count
        path, _, query = self.path.partition("?")
        if path == "/hello":
            self.send_text("hello from " + socket.gethostname())
        elif path == "/inc":
            with lock:
                count += 1
                n = count
            self.send_text(str(n))
        elif path == "/hang":
            threading.Event().wait()
        elif path == "/path":
            self.send_text(self.path)
        elif path == "/headers":
            self.send_text("".join("%s: %s\n" % (k.lower(), v) for k, v in self.headers.items()))
        elif path == "/big":
            n = int(query.split("=")[1])
            chunk = bytes(i % 251 for i in range(251)) * 262  # 65762 bytes, a whole number of periods
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            while n > 0:
                k = min(n, len(chunk))
                self.wfile.write(chunk[:k])
                n -= k
        elif path == "/ws" and self.headers.get("Upgrade"):
            self.send_response(101)
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", self.headers.get("Upgrade"))
            self.end_headers()
            self.wfile.flush()
            c = self.connection
            while True:
                d = c.recv(65536)
                if not d:
                    break
                c.sendall(d)
            self.close_connection = True
        else:
            self.send_error(404)

    def do_POST(self):
        n = len(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        self.send_text(str(n))

class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

S((sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1", int(sys.argv[1])), H).serve_forever()
