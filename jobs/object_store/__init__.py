"""Object storage (S3 and the S3-compatible stores, Huawei OBS among them): the URLs users type, and a client."""
