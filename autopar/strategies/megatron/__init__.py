"""autopar/strategies/megatron"""
