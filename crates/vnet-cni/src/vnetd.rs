//! Talking to vnetd: its control endpoint, and a request's answer.

use crate::spec::{Code, Error, NetConf, Result};
use vnet_client::client::Client;
use vnet_client::endpoint::Endpoint;
use vnet_client::request::Request;

/// vnetd at the configuration's `control` (code 11 when it does not answer).
pub fn vnetd(conf: &NetConf) -> Result<Client> {
    let ep: Endpoint = conf.control.parse().map_err(|e: vnet_client::endpoint::EndpointError| {
        Error::with(Code::InvalidConfig, format!("control `{}`", conf.control), e)
    })?;
    Client::connect(&ep)
        .map_err(|e| Error::with(Code::TryAgainLater, format!("vnetd is not answering at {ep}"), e))
}

/// Sends `req`; vnetd's answer, or its refusal (code 102).
pub fn request(c: &mut Client, req: &Request) -> Result<String> {
    let r = c.send(req).map_err(|e| Error::with(Code::Io, "talking to vnetd", e))?;
    r.result.map_err(|e| Error::with(Code::Refused, format!("vnetd refused `{req}`"), e))?;
    Ok(r.body)
}
