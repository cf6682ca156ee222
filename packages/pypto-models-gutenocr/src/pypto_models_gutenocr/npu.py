"""The torchair names ``--use_acl_graph`` relies on, declared and reached through NpuApi.

No machine that builds this project has an NPU, so these rows are checked statically
against every torch_npu wheel of the CANN matrix by ``tools/npu_api_check.py`` (this
table is registered there). The seed compiles through torchair with
``mode="reduce-overhead"`` (aclgraph) and ``experimental_config.frozen_parameter`` and
``experimental_config.tiling_schedule_optimize`` on. Both options are instance attributes
of torchair's ``_ExperimentalConfig`` (set in its ``__init__``), which ``CompilerConfig``
holds as ``experimental_config``.

Read in the wheels: from torch_npu 2.5.1.post1 on, torchair lists
``experimental_config.tiling_schedule_optimize`` among the options aclgraph
(reduce-overhead) does not support, so it warns and the option only acts in
max-autotune (GE) mode; it is set anyway because it is the seed's configuration.
"""

from __future__ import annotations

from pypto_common.npu_api import NpuApi, parse_table

# kind path [keywords] | where it was checked (torch_npu wheels 2.5.1 .. 2.12.0).
NPU_API_TABLE = """
module   torchair                                    | torch_npu/dynamo/torchair/__init__.py
class    torchair.CompilerConfig                     | torchair/configs/compiler_config.py
member   torchair.CompilerConfig.mode                | set in CompilerConfig.__init__ (max-autotune | reduce-overhead)
member   torchair.CompilerConfig.experimental_config | set in CompilerConfig.__init__ (an _ExperimentalConfig)
class    torchair.configs.experimental_config._ExperimentalConfig | torchair/configs/experimental_config.py
member   torchair.configs.experimental_config._ExperimentalConfig.frozen_parameter
         | set in _ExperimentalConfig.__init__ (OptionValue False, [True, False])
member   torchair.configs.experimental_config._ExperimentalConfig.tiling_schedule_optimize
         | set in _ExperimentalConfig.__init__ (OptionValue False, [True, False])
function torchair.get_npu_backend                    | torchair/npu_fx_compiler.py, re-exported
kwarg    torchair.get_npu_backend compiler_config    | get_npu_backend(*, compiler_config=None, ...)
"""

NPU = NpuApi(parse_table(NPU_API_TABLE), owner="pypto_models_gutenocr.npu")

#: The experimental options the seed turns on (attribute names on
#: ``CompilerConfig().experimental_config``, each declared above).
EXPERIMENTAL_ON = ("frozen_parameter", "tiling_schedule_optimize")

__all__ = ["EXPERIMENTAL_ON", "NPU", "NPU_API_TABLE"]
