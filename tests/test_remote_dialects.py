"""``RemoteEnv`` against tiny stand-ins of AgentGym's servers (WebShop, ALFWorld, WebArena).

The real servers need WebShop's product index, ALFWorld's game data and WebArena's websites, none
of which exist here. These stand-ins answer with exactly the reply shapes of AgentGym's
``agentenv-*/server.py`` (commit 3ef9235) and record what the client sent, so the dialect table is
checked end to end over real HTTP on loopback: request fields, reply parsing, admissible actions,
instructions, state clean-up, success, error replies, timeouts.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from dreamgym.envs.remote import RemoteEnv
from dreamgym.errors import ConfigError, EnvironmentSpecError, EnvironmentUnavailableError, RemoteEnvironmentError
from dreamgym.types import Task

HOST = "127.0.0.1"


class _Running:
    """A FastAPI app served by uvicorn in a thread on a loopback port."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((HOST, 0))
        self.url = f"http://{HOST}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the stand-in server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[FastAPI], str]]:
    running: list[_Running] = []

    def start(app: FastAPI) -> str:
        running.append(_Running(app))
        return running[-1].url

    yield start
    for r in running:
        r.stop()


# -- WebShop (agentenv-webshop: env_idx, bare-int /create, [obs, null] /reset, {state,...} /step) --

WEBSHOP_GOAL = "i need a red ceramic mug, and price lower than 20.00 dollars"


def webshop_app(log: list[tuple[str, Any]]) -> FastAPI:
    app = FastAPI()
    page = {"name": "search"}
    pages = {
        "search": f"WebShop [SEP] Instruction: [SEP] {WEBSHOP_GOAL} [SEP] Search",
        "results": f"Instruction: [SEP] {WEBSHOP_GOAL} [SEP] Back to Search [SEP] Page 1 (Total results: 1) "
                   "[SEP] Next > [SEP] B0001 [SEP] Red Ceramic Mug 12oz [SEP] $9.99",
        "item": f"Instruction: [SEP] {WEBSHOP_GOAL} [SEP] Back to Search [SEP] < Prev [SEP] Red Ceramic Mug 12oz "
                "[SEP] Price: $9.99 [SEP] Buy Now",
    }
    clickables = {"search": ["search"], "results": ["back to search", "next >", "b0001"],
                  "item": ["back to search", "< prev", "buy now"]}

    @app.get("/")
    def ok() -> str:
        return "ok"

    @app.post("/create")
    def create() -> int:
        return 31337

    @app.post("/reset")
    async def reset(request: Request) -> Any:
        log.append(("reset", await request.json()))
        page["name"] = "search"
        return [pages["search"], None]

    @app.get("/observation")
    def observation(env_idx: int) -> str:
        return pages[page["name"]]

    @app.get("/instruction_text")
    def instruction(env_idx: int) -> str:
        return f"Instruction: {WEBSHOP_GOAL}"

    @app.get("/available_actions")
    def available(env_idx: int) -> dict[str, Any]:
        return {"has_search_bar": page["name"] == "search", "clickables": clickables[page["name"]]}

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        body = await request.json()
        log.append(("step", body))
        action, reward, done = body["action"], 0.0, False
        if action.startswith("search["):
            page["name"] = "results"
        elif action == "click[b0001]":
            page["name"] = "item"
        elif action == "click[buy now]":
            reward, done = 1.0, True
        return {"state": pages[page["name"]], "reward": reward, "done": done, "info": None}

    return app


def test_webshop_dialect(serve: Callable[[FastAPI], str]) -> None:
    log: list[tuple[str, Any]] = []
    env = RemoteEnv("webshop", serve(webshop_app(log)), params={"task_ids": "100-102,7"}, max_steps=10)
    tasks = env.tasks(2, first=2)
    assert [t.params["index"] for t in tasks] == [102, 7] and tasks[0].instruction == ""
    obs = env.reset(tasks[0])
    assert log[-1] == ("reset", {"session_id": 102, "env_idx": 31337})
    assert obs.instruction == WEBSHOP_GOAL
    assert obs.admissible_actions == ["search[<keywords>]"]
    assert obs.state == "Search"  # [SEP] -> lines; "WebShop", "Instruction:" and the goal are dropped
    result = env.step("search[red mug]")
    assert log[-1] == ("step", {"env_idx": 31337, "action": "search[red mug]"})
    assert result.observation.admissible_actions == ["click[back to search]", "click[next >]", "click[b0001]"]
    assert result.observation.state.splitlines()[:2] == ["Back to Search", "Page 1 (Total results: 1)"]
    assert result.info["admissible"] is False  # the search template is not literally the action
    assert not env.step("click[b0001]").done
    final = env.step("click[buy now]")
    assert final.done and final.success and final.reward == 1.0
    assert env.admissible_actions() is None
    env.close()  # WebShop has no /close: nothing is sent
    assert all(kind != "close" for kind, _ in log)


def test_split_ranges_and_task_windows(serve: Callable[[FastAPI], str]) -> None:
    url = serve(webshop_app([]))
    env = RemoteEnv("webshop", url)  # WebShop's own split: test 0-499, dev 500-1499, train 1500+
    assert [t.params["index"] for t in env.tasks(2, first=3, split="train")] == [1503, 1504]
    assert [t.task_id for t in env.tasks(1, split="dev")] == ["remote:webshop/500"]
    with pytest.raises(EnvironmentSpecError, match="split 'test' holds 500 tasks"):
        env.tasks(2, first=499, split="test")
    with pytest.raises(EnvironmentSpecError, match="task_ids lists 3 tasks"):
        RemoteEnv("webshop", url, params={"task_ids": "4-6"}).tasks(2, first=2)
    with pytest.raises(ConfigError, match="runs backwards"):
        RemoteEnv("webshop", url, params={"task_ids": "9-3"})
    with pytest.raises(EnvironmentSpecError, match=r"no integer 'index' parameter"):
        env.reset(Task(task_id="x", env="remote:webshop", instruction=""))


# -- ALFWorld (agentenv-alfworld: id, {id} /create, available_actions in every reply, 200 + {error}) --


def alfworld_app(log: list[tuple[str, Any]]) -> FastAPI:
    app = FastAPI()
    ids = {0}
    intro = "You are in the middle of a room. Looking quickly around you, you see a sinkbasin 1."
    goal = "put a clean mug in coffeemachine."

    @app.get("/")
    def hello() -> str:
        return "This is environment AlfWorld."

    @app.post("/create")
    def create() -> dict[str, int]:
        return {"id": 0}

    @app.post("/reset")
    async def reset(request: Request) -> dict[str, Any]:
        body = await request.json()
        log.append(("reset", body))
        return {"id": body["id"], "observation": f"{intro}\n\nYour task is to: {goal}",
                "available_actions": ["go to sinkbasin 1", "inventory", "look"], "task_type": "pick_clean/trial_1"}

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        body = await request.json()
        if body["id"] not in ids:
            return {"error": f"The id {body['id']} is not valid."}
        won = body["action"] == "clean mug 1 with sinkbasin 1"
        return {"observation": "You win." if won else "Nothing happens.", "reward": float(won),
                "available_actions": ["look"], "done": won}

    return app


def test_alfworld_dialect(serve: Callable[[FastAPI], str]) -> None:
    log: list[tuple[str, Any]] = []
    env = RemoteEnv("alfworld", serve(alfworld_app(log)), params={"world_type": "Text"})
    obs = env.reset(env.tasks(1, first=12)[0])
    assert log[-1] == ("reset", {"game": 12, "world_type": "Text", "id": 0})
    assert obs.instruction == "put a clean mug in coffeemachine."
    assert obs.admissible_actions == ["go to sinkbasin 1", "inventory", "look"]
    miss = env.step("dance")
    assert (miss.done, miss.success, miss.info["admissible"]) == (False, False, False)
    win = env.step("clean mug 1 with sinkbasin 1")
    assert win.done and win.success and win.reward == 1.0
    # An error reply with HTTP 200, AgentGym style, becomes an error naming the endpoint.
    env.reset(env.tasks(1)[0])
    env._lease.env_id = 5  # as if the server had been restarted
    with pytest.raises(RemoteEnvironmentError, match=r"POST /step reported an error: The id 5 is not valid"):
        env.step("look")
    assert env._env_id is None  # a stale id is forgotten: the next reset creates a new environment


# -- WebArena (agentenv-webarena: env_idx, {env_idx} /create, reset {seed, idx}, terminated) -------


def webarena_app(log: list[tuple[str, Any]]) -> FastAPI:
    app = FastAPI()
    tree = "[1] RootWebArea 'One Stop Market' focused: True\n\t[5] link 'Mugs'\n\t[6] StaticText ''"
    objective = "What is the price of the cheapest mug?"

    @app.get("/")
    def ok() -> str:
        return "ok"

    @app.post("/create")
    def create() -> dict[str, int]:
        return {"env_idx": 3}

    @app.post("/reset")
    async def reset(request: Request) -> dict[str, Any]:
        log.append(("reset", await request.json()))
        return {"observation": tree, "sites": ["shopping"], "object": objective}

    @app.get("/observation")
    def observation(env_idx: int) -> str:
        return f"OBSERVATION:\n{tree}\nURL: http://shop.local/\nOBJECTIVE: {objective}\nPREVIOUS ACTION: None"

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        body = await request.json()
        log.append(("step", body))
        stop = body["action"].startswith("```stop")
        return {"observation": "OBSERVATION:\n[7] StaticText 'Done'\nURL: http://shop.local/\nOBJECTIVE: x",
                "reward": 1.0 if stop else 0.0, "terminated": stop, "truncated": False, "info": {}}

    @app.post("/close")
    async def close(request: Request) -> dict[str, str]:
        log.append(("close", await request.json()))
        return {"closed": "closed"}

    return app


def test_webarena_dialect(serve: Callable[[FastAPI], str]) -> None:
    log: list[tuple[str, Any]] = []
    env = RemoteEnv("webarena", serve(webarena_app(log)))
    obs = env.reset(env.tasks(1, first=8, split="test")[0])  # the 9th test task: every fifth config number
    assert log[-1] == ("reset", {"seed": 0, "idx": 40, "env_idx": 3})
    assert obs.instruction == "What is the price of the cheapest mug?" and obs.admissible_actions is None
    # The prompt template around the page is boilerplate; the page and its URL stay.
    assert obs.state == "[1] RootWebArea 'One Stop Market' focused: True\n[5] link 'Mugs'\nURL: http://shop.local/"
    env.step("click [5]")
    assert log[-1] == ("step", {"env_idx": 3, "action": "```click [5]```"})
    final = env.step("stop [$9.99]")
    assert final.done and final.success
    env.close()
    assert log[-1] == ("close", {"env_idx": 3})


# -- transport failures -----------------------------------------------------------------------


def broken_app() -> FastAPI:
    app = FastAPI()

    @app.get("/")
    def ok() -> str:
        return "ok"

    @app.post("/create")
    def create() -> PlainTextResponse:
        return PlainTextResponse("<html>proxy says hi</html>")

    @app.post("/reset")
    def reset() -> PlainTextResponse:
        return PlainTextResponse("Internal Server Error", status_code=500)

    @app.post("/step")
    def step() -> dict[str, Any]:
        time.sleep(1.5)
        return {}

    return app


def test_malformed_replies_and_timeouts_name_the_endpoint(serve: Callable[[FastAPI], str]) -> None:
    url = serve(broken_app())
    env = RemoteEnv("textcraft", url, timeout_s=0.5)
    with pytest.raises(RemoteEnvironmentError, match=r"POST /create answered something that is not JSON"):
        env.reset(env.tasks(1)[0])
    env._lease.env_id = 0
    with pytest.raises(RemoteEnvironmentError, match=r"POST /reset failed \(HTTP 500\): Internal Server Error"):
        env.reset(env.tasks(1)[0])
    env._task, env._done = env.tasks(1)[0], False
    with pytest.raises(EnvironmentUnavailableError, match=r"did not answer POST /step within 0.5 s \(env.timeout_s\)"):
        env.step("get 1 oak log")
    # After a timeout the server may still be working on (or have lost) the environment: it is not reused.
    assert env._env_id is None


def test_dreamgym_dialect_refuses_a_foreign_server(serve: Callable[[FastAPI], str]) -> None:
    url = serve(webarena_app([]))
    with pytest.raises(RemoteEnvironmentError, match=r"not a `dreamgym serve-env` server .*\(remote:webshop"):
        RemoteEnv("dreamgym", url)
