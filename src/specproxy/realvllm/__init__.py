"""Real vLLM CPU servers for the top test tier and the demo: the tiny model, the launcher.

`model_dir` builds the tiny model directory, `launcher` starts and stops the two servers
(`VllmPair`), `workload` holds the requests the tests send, and `cli` is `specproxy vllm`.
"""
