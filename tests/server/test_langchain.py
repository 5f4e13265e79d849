"""LangChain's OpenAI client (langchain-openai, from PyPI, unchanged) against `sala serve` (tiny
model, CPU): with_structured_output by every method (json_schema, function_calling, json_mode)
and bind_tools with a tool round trip (AIMessage.tool_calls, then a ToolMessage answered).
The tiny model's free text is no JSON: valid results come from the grammar."""
from typing import Annotated, List, Literal, Optional

import pydantic
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from common import Check, Server, log


class City(pydantic.BaseModel):
    """A city and its weather."""
    name: str = pydantic.Field(max_length=10)  # bounded: the tiny model would not end a free string
    temperature: int = pydantic.Field(ge=-50, le=50)
    sky: Literal["clear", "cloudy", "rain"]
    tags: List[Annotated[str, pydantic.Field(max_length=6)]] = pydantic.Field(max_length=2)


class Loose(pydantic.BaseModel):
    """json_mode constrains to a JSON object only: every field optional."""
    name: Optional[str] = None


@tool
def add(a: Annotated[int, pydantic.Field(ge=0, le=999)], b: Annotated[int, pydantic.Field(ge=0, le=999)]) -> int:
    """Add two integers."""
    return a + b


def main():
    ck = Check("langchain")
    with Server() as s:
        llm = ChatOpenAI(model=s.model_id, base_url=s.url + "/v1", api_key="unused", temperature=0,
                         max_tokens=300, max_retries=0, timeout=300)
        q = "Describe Paris."
        for method in ("json_schema", "function_calling"):
            r = llm.with_structured_output(City, method=method, include_raw=True).invoke(q)
            ck(isinstance(r["parsed"], City) and r["parsing_error"] is None,
               f"with_structured_output {method}: {r['parsed']!r} {r['parsing_error']} {r['raw'].content!r}")
            log(f"{method}: {r['parsed']!r}")
        r = llm.with_structured_output(Loose, method="json_mode", include_raw=True).invoke("Hi")
        ck(isinstance(r["parsed"], Loose), f"with_structured_output json_mode: {r['parsed']!r} {r['raw'].content!r}")
        r = llm.with_structured_output(City.model_json_schema(), method="json_schema").invoke(q)
        ck(isinstance(r, dict) and City.model_validate(r) is not None, f"json_schema from a dict schema: {r!r}")

        bound = llm.bind_tools([add], tool_choice="add")
        msgs = [HumanMessage("What is 2 + 3?")]
        ai = bound.invoke(msgs)
        calls = ai.tool_calls
        ck(len(calls) == 1 and calls[0]["name"] == "add" and set(calls[0]["args"]) == {"a", "b"},
           f"bind_tools named: {calls} {ai.invalid_tool_calls}")
        if calls:
            result = add.invoke(calls[0]["args"])
            msgs += [ai, ToolMessage(str(result), tool_call_id=calls[0]["id"])]
            final = llm.bind_tools([add]).invoke(msgs)
            ck(final.response_metadata.get("finish_reason") in ("stop", "length", "tool_calls"),
               f"tool round trip answered: {final!r}")
        ai = llm.bind_tools([add], tool_choice="any").invoke([HumanMessage("Add numbers")])
        ck(len(ai.tool_calls) >= 1 and all(c["name"] == "add" for c in ai.tool_calls),
           f"bind_tools tool_choice any (required): {ai.tool_calls}")
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
