"""Interactive front ends over a live topology: `pddlab serve` (an OpenAI-compatible front door) and `pddlab net`."""
