"""The openai package and curl against `activekv serve` (openai_client_test.sh runs this in its venv)."""
import json
import os
import subprocess
import sys

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import Server  # noqa: E402

srv = Server(sys.argv[1], "-c", "512", "--api-key", "sk-local")
srv.wait_ready()
base = "http://127.0.0.1:%d" % srv.port
client = openai.OpenAI(base_url=base + "/v1", api_key="sk-local", max_retries=0)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


models = client.models.list()
model = models.data[0].id
check(len(models.data) == 1 and model == "SmolLM2-135M-Instruct.Q4_1", "models: %r" % models)

# Chat, not streamed, greedy: then the same streamed must give the same text.
messages = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours."}]
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0)
text = whole.choices[0].message.content
check(whole.choices[0].finish_reason in ("stop", "length") and text, "chat: %r" % whole)
check(whole.usage.completion_tokens > 0 and whole.usage.total_tokens == whole.usage.prompt_tokens +
      whole.usage.completion_tokens, "chat usage: %r" % whole.usage)
chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0,
                                             stream=True, stream_options={"include_usage": True}))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(streamed == text, "chat streamed %r != whole %r" % (streamed, text))
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens,
      "stream usage chunk: %r" % chunks[-1])
print("[openai] chat: %r" % text)

# Completions with a stop string and a seed: sampled, reproducible.
kw = dict(model=model, prompt="The days of the week are Monday,", max_tokens=24, temperature=0.8, seed=7, stop=["Friday"])
a = client.completions.create(**kw)
b = client.completions.create(**kw)
check(a.choices[0].text == b.choices[0].text, "seeded completions differ: %r %r" % (a.choices[0].text, b.choices[0].text))
check("Friday" not in a.choices[0].text, "stop string in the output: %r" % a.choices[0].text)
streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
check(streamed == a.choices[0].text, "completion streamed %r != whole %r" % (streamed, a.choices[0].text))
print("[openai] completion: %r (%s)" % (a.choices[0].text, a.choices[0].finish_reason))

# Errors surface as the package's exception types.
for call, exc in [(lambda: client.completions.create(model="nope", prompt="x", max_tokens=2), openai.NotFoundError),
                  (lambda: client.completions.create(model=model, prompt="x", max_tokens=10 ** 9), openai.BadRequestError),
                  (lambda: openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list(),
                   openai.AuthenticationError)]:
    try:
        call()
        check(False, "no error raised, %s expected" % exc.__name__)
    except exc:
        pass

# curl: the README's example, whole and streamed.
out = subprocess.run(["curl", "-sS", base + "/v1/chat/completions", "-H", "Authorization: Bearer sk-local",
                      "-H", "Content-Type: application/json", "-d",
                      json.dumps({"messages": messages, "max_tokens": 20, "temperature": 0})],
                     capture_output=True, text=True, check=True).stdout
check(json.loads(out)["choices"][0]["message"]["content"] == text, "curl chat: %s" % out)
out = subprocess.run(["curl", "-sSN", base + "/v1/completions", "-H", "Authorization: Bearer sk-local", "-d",
                      json.dumps({"prompt": "Once upon a time", "max_tokens": 5, "stream": True})],
                     capture_output=True, text=True, check=True).stdout
check(out.rstrip().endswith("data: [DONE]") and out.count("data: ") >= 3, "curl stream: %r" % out)
check(subprocess.run(["curl", "-sf", base + "/health"], capture_output=True).returncode == 0, "curl /health")

check(srv.stop() == 0, "server exit code")
if failures:
    print("%d failure(s)" % len(failures))
    sys.exit(1)
print("all passed")
