"""autopar/strategies/dsp"""
