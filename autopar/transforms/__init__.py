"""autopar/transforms"""
