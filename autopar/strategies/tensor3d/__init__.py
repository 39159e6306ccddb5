"""autopar/strategies/tensor3d"""
