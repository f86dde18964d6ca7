from sluice import grpc_defaults

grpc_defaults.apply()  # before anything of the dispatcher imports grpc
