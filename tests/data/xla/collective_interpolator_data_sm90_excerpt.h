/* Copyright 2025 The OpenXLA Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
==============================================================================*/

// Excerpt: the sm_90 entries with 8 devices per group and tensors of 1 MiB and more of
// xla/service/gpu/model/collective_interpolator_data.h (the version with sm_90 entries only,
// 90,334 characters), in that file's format; every other entry left out.
constexpr char kDefaultCollectivePTable[] = R"pb(
  entries {
    key: "sm_90"
    value {
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 262144
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 22443835616
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 524288
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 43030860144
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 1048576
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 63906387128
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 2097152
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 74451576256
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 4194304
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 110353188802
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 8388608
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 144272977435
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 16777216
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 165927051190
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 262144
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 42666666666
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 524288
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 62594078319
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 1048576
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 87323117921
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 2097152
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 134432820512
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 4194304
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 194613214550
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 8388608
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 232397163120
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 16777216
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 313428784934
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 32768
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 35121114683
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 65536
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 82643127364
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 131072
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 116924174843
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 262144
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 153390286717
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 524288
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 204560280920
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 1048576
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 233900513049
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 268435456
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 222030980976
      }
      entries {
        instruction {
          opcode: "all-reduce"
          shape {
            element_type: F32
            dimensions: 536870912
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 224423344971
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 268435456
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 391036278245
      }
      entries {
        instruction {
          opcode: "all-gather"
          shape {
            element_type: F32
            dimensions: 536870912
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 400124397805
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 33554432
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 364916444628
      }
      entries {
        instruction {
          opcode: "reduce-scatter"
          shape {
            element_type: F32
            dimensions: 67108864
            layout { minor_to_major: 0 tail_padding_alignment_in_elements: 1 }
            is_dynamic_dimension: false
          }
          dimensions: 0
          channel_id: 1
          use_global_device_ids: true
          collective_device_list {
            iota_replica_group_list {
              num_replica_groups: 1
              num_devices_per_group: 8
              iota_reshape_dims: 8
              iota_transpose_perm: 0
            }
          }
        }
        network_throughput_bytes_per_sec: 373842693108
      }
    }
  }
)pb";
