"""``inferwatch baseline``'s load sweep, one module per concern.

- :mod:`.command`: the command itself (its documentation, run, exit status);
- :mod:`.plan`: its options, and the sweep they describe;
- :mod:`.prompts`: the request inputs: generated to a token length, or read from JSONL;
- :mod:`.histograms`: the server's TTFT and ITL histograms over a cell's window;
- :mod:`.cells`: one cell's requests and what they measured;
- :mod:`.report`: what the user sees: progress, the table, regressions.
"""
