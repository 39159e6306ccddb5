"""autopar/analysis"""
