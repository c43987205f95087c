"""The batch-size testbed (archived): did DeCL at batch B reach InfoNCE at 2B? Its objectives, rule, reports
and blocks, kept so that its committed reports and the docs' blocks regenerate from their JSON.

The runs came from the study plans in ``benchmarks/studies/`` (:mod:`clip_dcl.experiment.study`);
``benchmarks/batch_size.py`` turns them into the testbed's reports and regenerates the committed ones. The
confirmatory study decides in its place (docs/results.md). Imported as ``testbed`` by the scripts beside it.

* :mod:`.objectives`: the objectives (every flag written out) and the testbed's settings;
* :mod:`.rule`: the decision rule and the readings (reach, beat, the controls, the ``dcl`` sweep);
* :mod:`.report`: ``batch_size.md``, ``dcl_screen.md``, ``dcl_sweep.md`` and their JSON;
* :mod:`.blocks`: the README's and docs' generated blocks.
"""
