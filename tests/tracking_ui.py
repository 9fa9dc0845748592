"""MLflow's UI on a tracked run of step 02, opened as a user opens it, checked, and photographed.

    python tests/tracking_ui.py --out results/tracking-ui

Makes a tracked run (02-ray-train-ddp/train_ray_ddp_with_mlflow.py: 3 epochs of 20 steps of `tiny` on synthetic
data, 2 workers, into a temporary store), or takes one: --tracking-uri URI, and --run RAY_RUN_NAME (default: the
store's newest run of step 02). Then starts `mlflow ui` on a free local port against that store, loads the run's
pages in headless Chromium (driven over its DevTools protocol), waits until the React app shows the run's name,
a row per parameter (its name, then its value; a row it never logged is not found) and the last test_accuracy
after its name, and one point per epoch on the test_accuracy chart, and saves
screenshot.png (the run's charts above its overview) and results.md into --out. Exits 1 if anything is missing.

Needs the full mlflow package (requirements.txt; mlflow-skinny has no UI) and Chromium (`apt-get install
chromium`, or --chromium PATH).
"""
import argparse
import asyncio
import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.record import ROOT, describe_machine
from common.tracking import RAY_RUN_TAG, absolute_uri

VARIANT = "02-ray-train-ddp/train_ray_ddp_with_mlflow.py"
EXPERIMENT = "ray_ddp_mlflow"  # the variant's STEP: its MLflow experiment
RUN_FLAGS = ["--data", "synthetic", "--model", "tiny", "--epochs", "3", "--steps-per-epoch", "20", "--num-workers", "2"]
WINDOW = dict(width=1600, height=1000)
# The UI's own settings, in the browser's localStorage (MLflow 3.17): the "Model training" view rather than
# "GenAI", and its assistant panel closed, as a user who opened the UI before would see it.
UI_SETTINGS = {"mlflow.workflowType_v1": '"machine_learning"', "mlflow.assistant.panelOpen_v1": "false",
               "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/tracking-ui"))
    parser.add_argument("--tracking-uri", type=absolute_uri,
                        help="a store that holds a tracked run (default: make one)")
    parser.add_argument("--run", help="the Ray run name of the run to show (default: the newest)")
    parser.add_argument("--address", help="--address for the run this makes (default: a local Ray)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                        help="the Chromium (or Chrome) executable")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the UI to start, and for each page")
    args = parser.parse_args()
    if not args.chromium:
        sys.exit("error: no Chromium found; `apt-get install chromium` (Debian, Ubuntu) or pass --chromium PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        made = None if args.tracking_uri else make_run(Path(scratch), args.address)
        uri = args.tracking_uri or made["uri"]
        run, experiment_id = find_run(uri, args.run)
        started = time.perf_counter()
        with mlflow_ui(uri, Path(scratch) / "mlflow-ui.log", args.timeout) as base:
            ui_seconds = time.perf_counter() - started
            report = asyncio.run(look(args.chromium, base, experiment_id, run, args.timeout, Path(scratch)))
    stack(report.pop("screenshots"), args.out / "screenshot.png")
    (args.out / "results.md").write_text(results_markdown(report, run, made, ui_seconds, args.chromium))
    print(f"screenshot: {args.out / 'screenshot.png'}; results: {args.out / 'results.md'}")
    if report["missing"]:
        sys.exit(f"error: the UI did not show {', '.join(report['missing'])}")


def make_run(scratch: Path, address: str | None) -> dict:
    uri = f"sqlite:///{scratch / 'mlflow.db'}"
    cmd = [sys.executable, VARIANT, *RUN_FLAGS, "--checkpoint-dir", str(scratch / "checkpoints"), "--tracking-uri", uri]
    cmd += ["--address", address] if address else []
    print("training:", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode:
        sys.exit(f"error: the tracked run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(uri=uri, command=" ".join(["python", VARIANT, *RUN_FLAGS]))


def find_run(uri: str, ray_run: str | None):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        sys.exit(f"error: no experiment {EXPERIMENT} in {uri}; make a run with {VARIANT} --tracking-uri {uri}")
    where = f"tags.{RAY_RUN_TAG} = '{ray_run}'" if ray_run else ""
    runs = client.search_runs([experiment.experiment_id], where, order_by=["attributes.start_time DESC"])
    if not runs:
        sys.exit(f"error: no run {ray_run or ''} in experiment {EXPERIMENT} of {uri}")
    run = runs[0]
    history = {key: client.get_metric_history(run.info.run_id, key) for key in run.data.metrics}
    run.epochs = len(history.get("test_accuracy", []))
    return run, experiment.experiment_id


class mlflow_ui:
    """`mlflow ui` against the store, on a free local port, in its own process group (its server's workers too),
    ended on exit. One worker: the default 4 start slowly on a small machine and are restarted while they do. No job
    runner (MLflow's background jobs, its own processes, about 11 core-seconds here): showing a run needs none."""

    def __init__(self, uri: str, log: Path, timeout: float):
        self.uri, self.log, self.timeout = uri, log, timeout

    def __enter__(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", self.uri, "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1"]
        self.process = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                                        start_new_session=True)
        base = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + self.timeout
        while not answers(base + "health"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                sys.exit(f"error: `mlflow ui` did not start (it needs the full mlflow package, not mlflow-skinny):\n"
                         f"{self.log.read_text()[-2000:]}")
            time.sleep(0.5)
        return base

    def __exit__(self, *exc):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


async def look(chromium: str, base: str, experiment_id: str, run, timeout: float, scratch: Path) -> dict:
    """The run's two pages in a fresh headless Chromium: what each shows once the app has drawn it, and a
    screenshot of each."""
    import aiohttp  # a dependency of mlflow's server

    profile = scratch / "chromium-profile"
    browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                                "--disable-background-networking", f"--user-data-dir={profile}",
                                "--remote-debugging-port=0", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it chose here
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if browser.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"error: {chromium} did not start")
            await asyncio.sleep(0.2)
        port = port_file.read_text().split()[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                page = next(t for t in await response.json() if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                return await check_pages(DevTools(ws), base, experiment_id, run, timeout)
    finally:
        os.killpg(browser.pid, signal.SIGTERM)
        browser.wait(timeout=30)


async def check_pages(browser, base: str, experiment_id: str, run, timeout: float) -> dict:
    await browser("Emulation.setDeviceMetricsOverride", **WINDOW, deviceScaleFactor=1, mobile=False)
    await browser("Page.navigate", url=base + "health")  # the UI's origin, to hold its settings
    await browser.wait_for(f"location.href == {json.dumps(base + 'health')}", 30)
    await browser.js("; ".join(f"localStorage.setItem({json.dumps(key)}, {json.dumps(value)})"
                               for key, value in UI_SETTINGS.items()))
    run_page = f"{base}#/experiments/{experiment_id}/runs/{run.info.run_id}"
    # On the overview, as its tables' rows: each parameter's name then its value, the last test accuracy after its
    # name (a value alone, such as "1" or "tiny", would be found anywhere on the page). And the run's name.
    accuracy = run.data.metrics["test_accuracy"]
    accuracy = str(int(accuracy)) if accuracy.is_integer() else repr(accuracy)  # as JavaScript writes it: 1, not 1.0
    pairs = [["test_accuracy", accuracy], *map(list, sorted(run.data.params.items()))]
    absent = ["epochs", str(int(run.data.params["epochs"]) + 1)]  # a row the page does not have: the check must fail it
    shown = (r'(pair => new RegExp("(^|\\s)" + pair.map(w => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"))'
             r'.join("\\s+") + "(\\s|$)").test(document.body.innerText))')
    shows_all = (f"document.body.innerText.includes({json.dumps(run.info.run_name)}) && "
                 f"{json.dumps(pairs)}.every({shown})")
    # The test_accuracy chart, with one point per epoch: on the run's Model metrics tab.
    points = ('[...document.querySelectorAll("[data-testid=experiment-view-compare-runs-card]")]'
              '.filter(card => card.innerText.includes("test_accuracy"))'
              '.map(card => card.querySelectorAll("path.point").length)[0] || 0')
    pages = [("charts", run_page + "/model-metrics", f"{points} >= {run.epochs}"),
             ("overview", run_page, shows_all)]
    report = dict(screenshots=[], missing=[], seconds={})
    for name, url, drawn in pages:
        started = time.perf_counter()
        await browser("Page.navigate", url=url)
        if await browser.wait_for(drawn, timeout):
            report["seconds"][name] = time.perf_counter() - started
        elif name == "charts":  # timed out: say what is missing
            drawn_points = await browser.js(points)
            report["missing"].append(f"{run.epochs} points on the test_accuracy chart (drawn: {drawn_points})")
        else:
            report["missing"] += [f"{' '.join(pair)!r} on the overview" for pair in pairs
                                  if not await browser.js(f"{shown}({json.dumps(pair)})")]
        if name == "overview" and await browser.js(f"{shown}({json.dumps(absent)})"):
            report["missing"].append(f"nothing: the check found {' '.join(absent)!r}, which the run never logged")
        await asyncio.sleep(1)  # let the charts finish their transitions
        shot = await browser("Page.captureScreenshot", format="png")
        report["screenshots"].append(base64.b64decode(shot["data"]))
    report["parameters"] = len(run.data.params)
    return report


class DevTools:
    """A minimal client of Chromium's DevTools protocol over one page's websocket: call a method, await its
    answer (events that arrive meanwhile are dropped); evaluate JavaScript; wait for an expression."""

    def __init__(self, ws):
        self.ws, self.calls = ws, 0

    async def __call__(self, method: str, **params):
        self.calls += 1
        await self.ws.send_json({"id": self.calls, "method": method, "params": params})
        async for message in self.ws:
            answer = json.loads(message.data)
            if answer.get("id") == self.calls:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]
        raise RuntimeError(f"{method}: Chromium closed the connection")

    async def js(self, expression: str):
        result = await self("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float):
        """The expression's value once it is truthy (the app has drawn what it tests), or None after timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := await self.js(expression):
                return value
            await asyncio.sleep(0.5)
        return None


def stack(pngs: list, path: Path) -> None:
    """The screenshots one above the other, in one PNG."""
    from PIL import Image  # matplotlib's dependency

    images = [Image.open(io.BytesIO(png)) for png in pngs]
    sheet = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images)), "white")
    top = 0
    for image in images:
        sheet.paste(image, (0, top))
        top += image.height
    sheet.save(path)


def results_markdown(report: dict, run, made: dict | None, ui_seconds: float, chromium: str) -> str:
    import mlflow

    version = subprocess.run([chromium, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    seconds = report["seconds"]
    drawn = (f"drew the run's Model metrics tab in {seconds['charts']:.0f} s and its overview in "
             f"{seconds['overview']:.0f} s" if len(seconds) == 2 else "did not draw everything")
    command = " ".join(["python", *[str(a) for a in sys.argv]])
    source = (f"a run made for it: `{made['command']}`, into a temporary store" if made
              else "the store given with --tracking-uri")
    checked = ("all of them shown" if not report["missing"] else "missing: " + ", ".join(report["missing"]))
    return "\n".join([
        f"`{command}`", "",
        f"Machine: {describe_machine()}; mlflow {mlflow.__version__}; {version or chromium}; "
        f"{time.strftime('%Y-%m-%d')}", "",
        f"The run: {source}. MLflow run `{run.info.run_name}` (tag `{RAY_RUN_TAG}`), {run.epochs} epochs logged, "
        f"{report['parameters']} parameters.", "",
        f"`mlflow ui --workers 1` answered after {ui_seconds:.0f} s; headless Chromium {drawn}. Checked: the "
        f"run's name, a row per parameter (its name, then its value) and the last test_accuracy after its name "
        f"(a row the run never logged is not found), and one point per epoch on the test_accuracy chart: "
        f"{checked}.", "",
        "`screenshot.png`: above, the run's Model metrics tab (one chart per metric, a point per epoch); below, "
        "its overview (the last value of each metric, the parameters, the tag that ties it to its Ray run).", ""])


if __name__ == "__main__":
    main()
