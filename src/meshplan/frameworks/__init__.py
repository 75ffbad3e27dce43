"""From plan to launch: a plan as the settings of the framework that runs it (torchtitan, Megatron-LM and
Megatron-Bridge, DeepSpeed), an existing configuration of those frameworks read back as a plan and a job, and
a Hugging Face ``config.json`` read as a model spec.

Pure Python: exporting writes plain text and reading a config.json needs only the json module. The
frameworks' own parsers check the exports in tests (the ``frameworks-check`` extra); meshplan never imports
them.
"""
