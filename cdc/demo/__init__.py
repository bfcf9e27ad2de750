"""The end-to-end demos on the local stack, each running one of the example pipelines:

- ``shop`` (`cdc demo`, `./dev demo`): examples/pipelines/shop.yaml over the demo Postgres database
  (:mod:`cdc.demo.shop`);
- ``games`` (`cdc demo games`): examples/pipelines/game_events.yaml over generated game events
  (:mod:`cdc.demo.games`).
"""

from __future__ import annotations

from pathlib import Path

from cdc.core.config import Settings
from cdc.core.errors import ConfigError
from cdc.demo.show import Say
from cdc.pipeline.load import load_pipeline
from cdc.stack.local import LocalStack

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "pipelines"
PIPELINES = {"shop": EXAMPLES_DIR / "shop.yaml", "games": EXAMPLES_DIR / "game_events.yaml"}


def run_demo(settings: Settings, example: str, output_dir: Path, say: Say = print) -> None:
    """Bring the local stack up, then run the ``example`` demo (``shop`` or ``games``)."""
    from cdc.core.session import build_spark_session
    from cdc.demo.games import games_demo
    from cdc.demo.shop import shop_demo

    file = PIPELINES[example]
    if not file.is_file():
        raise ConfigError(
            "the example pipeline is missing: run the demo from a checkout of the project", file=str(file)
        )
    pipeline = load_pipeline(file)  # checked before anything starts
    say("starting the local stack (Postgres, Kafka, Kafka Connect with Debezium, S3Proxy) ...")
    for component in LocalStack(settings.stack).up():
        say(f"  {component.name:<9} up on {component.address}")
    demo = shop_demo if example == "shop" else games_demo
    demo(build_spark_session(settings.spark), settings, pipeline, output_dir, say)
