"""Telemetry: GPU (NVML), host (psutil) and vLLM server (/metrics) samples on one clock.

Every sample carries ``t`` = ``time.time()`` epoch seconds, the same clock the load
generator stamps its windows with, so the TUI and ``vtui bench`` can line them up.
Nothing here imports Textual or Rich.
"""
