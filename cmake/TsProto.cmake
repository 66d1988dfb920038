# Protobuf + gRPC code generation into the build tree (generated code is never committed).
#
#   ts_proto_library(NAME PROTOS proto/tokenselect/v1/foo.proto ... [GRPC])
#     Runs protoc (and grpc_cpp_plugin with GRPC) on the given files, relative to the repository
#     root, writing into ${CMAKE_BINARY_DIR}/gen so that includes read
#     "proto/tokenselect/v1/foo.pb.h"; builds a static library NAME from the result.
include_guard(GLOBAL)

function(ts_proto_library name)
  cmake_parse_arguments(ARG "GRPC" "" "PROTOS" ${ARGN})
  set(gen_dir ${PROJECT_BINARY_DIR}/gen)
  file(MAKE_DIRECTORY ${gen_dir})
  set(srcs)
  foreach(proto IN LISTS ARG_PROTOS)
    get_filename_component(dir ${proto} DIRECTORY)
    get_filename_component(stem ${proto} NAME_WE)
    set(outs ${gen_dir}/${dir}/${stem}.pb.cc ${gen_dir}/${dir}/${stem}.pb.h)
    set(plugin_args)
    if(ARG_GRPC)
      list(APPEND outs ${gen_dir}/${dir}/${stem}.grpc.pb.cc ${gen_dir}/${dir}/${stem}.grpc.pb.h)
      set(plugin_args --grpc_out=${gen_dir} --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>)
    endif()
    add_custom_command(
      OUTPUT ${outs}
      COMMAND protobuf::protoc --proto_path=${PROJECT_SOURCE_DIR} --cpp_out=${gen_dir} ${plugin_args}
              ${PROJECT_SOURCE_DIR}/${proto}
      DEPENDS ${PROJECT_SOURCE_DIR}/${proto} protobuf::protoc
      COMMENT "protoc ${proto}" VERBATIM)
    list(APPEND srcs ${outs})
  endforeach()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} SYSTEM PUBLIC ${gen_dir})
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf)
  if(ARG_GRPC)
    target_link_libraries(${name} PUBLIC gRPC::grpc++)
  endif()
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
