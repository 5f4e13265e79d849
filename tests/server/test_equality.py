"""A greedy request served alongside 7 others gives the same tokens as served alone."""
import threading

from common import Check, Server, log

TARGET = {"text": "What is 426+750? copper lantern", "sampling_params": {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}}
OTHERS = ["Hello", "summit " * 120, "What is 1+2?", "copper " * 300, "Tell me a story", "orbit prism", "x y z " * 50]


def main():
    ck = Check("equality")
    with Server() as s:
        alone = s.post_json("/generate", TARGET)
        log("alone:", repr(alone["text"]))
        for rnd in range(3):
            res = {}

            def run(k, body):
                res[k] = s.post_json("/generate", body)

            ts = [threading.Thread(target=run, args=("target", TARGET))]
            for j, p in enumerate(OTHERS):
                ts.append(threading.Thread(target=run, args=(j, {"text": p, "sampling_params": {
                    "temperature": 0.9 if j % 2 else 0, "max_new_tokens": 20 + 7 * j, "ignore_eos": True}})))
            if rnd == 1:
                ts = ts[1:] + ts[:1]  # the target joins a running batch
            for t in ts:
                t.start()
                if rnd == 2:
                    pass
            [t.join() for t in ts]
            ck(res["target"]["text"] == alone["text"], f"round {rnd}: batched {res['target']['text']!r} != alone {alone['text']!r}")
        # chat, via the OpenAI route, same check
        chat = {"messages": [{"role": "user", "content": "What is 845+822?"}], "temperature": 0, "max_tokens": 16}
        a = s.post_json("/v1/chat/completions", chat)["choices"][0]["message"]["content"]
        res = {}
        ts = [threading.Thread(target=lambda: res.__setitem__("t", s.post_json("/v1/chat/completions", chat)))]
        ts += [threading.Thread(target=s.post_json, args=("/generate", {"text": p, "sampling_params": {"max_new_tokens": 30}})) for p in OTHERS]
        [t.start() for t in ts]
        [t.join() for t in ts]
        ck(res["t"]["choices"][0]["message"]["content"] == a, "chat: batched == alone")
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
