"""instructor (PyPI, unchanged) with Pydantic models against `sala serve` (tiny model, CPU).
instructor turns a response_model into a request and validates the answer with Pydantic:
  * Mode.TOOLS: one tool from the model's schema, tool_choice naming it (the server enforces the
    named choice with the grammar engine), arguments parsed from message.tool_calls;
  * Mode.JSON_SCHEMA: response_format json_schema with the model's schema;
  * Mode.JSON: response_format json_object, the schema only in the system message: the server
    guarantees a JSON object (checked), the schema is for the model to follow, which the tiny
    model does not do (its objects may fail Pydantic's validation: then the test checks that
    what instructor got was a JSON object).
The tiny model's free text is not JSON, so a valid object is the grammar's doing. max_retries=0:
a first answer that does not validate fails the test in the schema modes (instructor would otherwise re-ask).
Each result is also validated with jsonschema against the model's own JSON schema, greedy and
sampled."""
import json
from typing import Annotated, List, Literal

import instructor
from instructor.core.exceptions import InstructorRetryException
import jsonschema
import openai
import pydantic

from common import Check, Server, log


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=10)
    zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")


class User(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    role: Literal["admin", "user", "guest"]
    tags: List[Annotated[str, pydantic.StringConstraints(max_length=8)]] = pydantic.Field(max_length=3)
    address: Address


class Verdict(pydantic.BaseModel):
    label: Literal["positive", "negative"]
    confidence: float = pydantic.Field(ge=0, le=1)


MODES = [instructor.Mode.TOOLS, instructor.Mode.JSON, instructor.Mode.JSON_SCHEMA]
CASES = [(User, "Extract the user: Ann, 31, admin, lives in Paris 75001."),
         (Verdict, "Classify the sentiment of: I love this.")]


def main():
    ck = Check("instructor")
    log("instructor", instructor.__version__, "openai", openai.__version__)
    with Server() as s:
        base = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        for mode in MODES:
            client = instructor.from_openai(base, mode=mode)
            for model_cls, prompt in CASES:
                for temp, seed in ((0.0, None), (1.0, 7)):
                    what = f"{mode.name} {model_cls.__name__} T={temp}"
                    try:
                        obj, raw = client.chat.completions.create_with_completion(
                            model=s.model_id, response_model=model_cls, max_retries=0, max_tokens=400,
                            temperature=temp, seed=seed, messages=[{"role": "user", "content": prompt}])
                    except InstructorRetryException as e:
                        if mode == instructor.Mode.JSON:
                            # The schema is only in the prompt: the server owes a JSON object.
                            content = e.last_completion.choices[0].message.content
                            ck(isinstance(json.loads(content), dict), f"{what}: not a JSON object: {content!r}")
                            log(f"{what}: a JSON object the tiny model filled its own way: {content[:80]!r}")
                        else:
                            ck(False, f"{what}: {str(e)[:800]}")
                        continue
                    except Exception as e:  # the HTTP error or an incomplete output, named
                        ck(False, f"{what}: {type(e).__name__}: {str(e)[:500]}")
                        continue
                    ck(isinstance(obj, model_cls), f"{what}: a {model_cls.__name__}, got {type(obj)}")
                    try:
                        jsonschema.validate(obj.model_dump(), model_cls.model_json_schema())
                        ck(True, "")
                    except jsonschema.ValidationError as e:
                        ck(False, f"{what}: {obj!r} breaks the schema: {e.message}")
                    msg = raw.choices[0].message
                    if mode == instructor.Mode.TOOLS:
                        calls = msg.tool_calls or []
                        ck(len(calls) == 1 and calls[0].function.name == model_cls.__name__,
                           f"{what}: one call of {model_cls.__name__}: {calls}")
                        ck(raw.choices[0].finish_reason in ("tool_calls", "stop"),
                           f"{what}: finish_reason {raw.choices[0].finish_reason}")
                    else:
                        ck(model_cls.model_validate_json(msg.content).model_dump() == obj.model_dump(), f"{what}: content {msg.content!r} is {obj!r}")
                    log(f"{what}: {obj!r}")
        ck(s.alive(), "server alive")
    ck.done()


if __name__ == "__main__":
    main()
