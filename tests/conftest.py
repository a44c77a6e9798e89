"""Shared test options: `--backend` picks the shaping backend of the emulation tests."""


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        default="auto",
        choices=("auto", "tc", "userspace"),
        help="shaping backend for tests/emulation (default: auto)",
    )
