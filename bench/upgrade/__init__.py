"""The upgrade check (``python -m bench.upgrade``, ``make upgrade-check``): the previous release upgraded to
this tree under traffic, the operator's leader killed under load and a node drained, audited."""
