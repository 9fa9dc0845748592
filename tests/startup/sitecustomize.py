"""Run by every Python process the suite starts: conftest.py puts this folder first on PYTHONPATH, which the
processes it starts inherit, and Ray's workers with them (labs.harness keeps it in a lab's job). Python collects
its youngest objects every 700 allocations; importing torch, torchvision and Ray Train, which every Ray worker and
training process does, allocates millions that live as long as the process. Every 10,000: that import costs 3.1
CPU seconds instead of 3.8, the whole suite 2399 and 2508 busy core-seconds instead of 2569 (AMD EPYC Zen 5, 2
cores; tests/history/suite-time/). Nothing the tests compare depends on when a cycle is collected."""
import gc

gc.set_threshold(10_000, 10, 10)
