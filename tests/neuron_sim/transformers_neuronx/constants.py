"""Stand-in of ``src/transformers_neuronx/constants.py`` at aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818):
enums and constants (the ones the stand-in uses), values as in the source."""
import enum

TILE_SIZE = 128
FUSED_QKV_TP_FACTOR = 3
KV_SHARD_PAD = 128
TRN1_WORLD_SIZE = 32
LAYOUT_BSH = 'BSH'
LAYOUT_HSB = 'HSB'
LAYOUT_SBH = 'SBH'


class Layout(enum.Enum):
    HSB = 'HSB'
    BSH = 'BSH'
    SBH = 'SBH'

    def __eq__(self, value):  # compares equal to its string value; defining __eq__ alone leaves it unhashable
        return super().__eq__(Layout(value))


class GQA(enum.Enum):
    SHARD_OVER_HEADS = 'shard-over-heads'
    SHARD_OVER_BATCH = 'shard-over-batch'
    REPLICATED_HEADS = 'replicated-heads'
    ALL_GATHER_HEADS = 'all-gather-heads'
