"""Child process (8 forced CPU devices) for the dry-run test: ``python -m tests.train.run_dry_run
SPEC...``, each ``SPEC`` a comma-separated list of ``dotted.key=value`` overrides of the GRPO
config (values parsed as JSON, else kept as strings). Prints one JSON line: the list of
:func:`hindsight.train.dry_run.dry_run` reports, one per spec."""
import json
import sys

from configs.base import method_file
from hindsight.train.dry_run import dry_run


def config_of(spec: str):
    config = method_file("grpo", None).to_dict()
    for item in filter(None, spec.split(",")):
        key, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, last = key.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[last] = value
    return config


def main():
    print(json.dumps([dry_run(config_of(spec), prompt_tokens=16) for spec in sys.argv[1:]]))


if __name__ == "__main__":
    main()
