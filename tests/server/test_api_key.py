"""The API key (issue 23) from $SALA_API_KEY or --api-key-file as well as --api-key;
/health and /metrics stay open without it unless --protect-metrics."""
import os
import tempfile

from common import Check, Server


def probe(s, path, key):
    h = {"Authorization": "Bearer " + key} if key else {}
    c = s.conn(10)
    c.request("GET", path, headers=h)
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def main():
    ck = Check("api_key")
    with Server([], env={"SALA_API_KEY": "env-key-1"}, api_key="env-key-1") as s:
        ck(probe(s, "/v1/models", None) == 401, "$SALA_API_KEY: no key -> 401")
        ck(probe(s, "/v1/models", "wrong") == 401, "$SALA_API_KEY: wrong key -> 401")
        ck(probe(s, "/v1/models", "env-key-1") == 200, "$SALA_API_KEY: right key -> 200")
        ck(probe(s, "/metrics", None) == 200, "/metrics open without the key by default")
        ck(probe(s, "/health", None) == 200, "/health open")
    with tempfile.NamedTemporaryFile("w", suffix=".key", delete=False) as f:
        f.write("file-key-2\n")
    try:
        with Server(["--api-key-file", f.name, "--protect-metrics"], api_key="file-key-2") as s:
            ck(probe(s, "/v1/models", None) == 401, "--api-key-file: no key -> 401")
            ck(probe(s, "/v1/models", "file-key-2") == 200, "--api-key-file: key (newline stripped) -> 200")
            ck(probe(s, "/metrics", None) == 401, "--protect-metrics: /metrics needs the key")
            ck(probe(s, "/metrics", "file-key-2") == 200, "--protect-metrics: /metrics with the key")
            ck(probe(s, "/health", None) == 200, "/health open even with --protect-metrics")
    finally:
        os.unlink(f.name)
    ck.done()


if __name__ == "__main__":
    main()
